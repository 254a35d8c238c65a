"""The chat agent's turns, run by `ChatRunner` in this process against a real nats-server, a
real budget replica and the scripted LM (a FAKE model server): each escalation step and each
fallback, ReAct tool use with every call recorded, a clarification round trip, and the state
rebuilt from the log after a turn equal to the state the turn held live.

The recursive engine is replaced here by `StandInEngine`, a FAKE named so: the engine has its
own tests with a real sandbox broker (tests/integration/agent/test_rlm*.py); what is tested
here is that the chat agent hands it the turn, records the child run and uses its answer.
"""

import asyncio
import http.server
import ipaddress
import json
import os
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext

from fleet_agent.chat.runner import ChatOptions, ChatRunner
from fleet_agent.chat.tools import TurnState
from fleet_agent.chat.urls import UrlLoader, public_only
from fleet_agent.engine.mesh import MeshPool
from fleet_agent.engine.model import EngineMesh, RlmResult, RlmTask, RunContext, root_run_id
from fleet_agent.lenient import LenientCodec
from fleet_agent.runners import Answered, CancelToken, Failed, Parked, Stopped, TurnInput
from fleet_events import Actor, Envelope, Event, bus, new_id, streams, utc_now
from fleet_events.bus import Ping
from fleet_events.llm import LlmProfile
from fleet_events.run import (
    ChildRunCompleted,
    ChildRunRequested,
    Escalated,
    FellBack,
    IterationPlanned,
    LlmCalled,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    ToolCalled,
    ToolReturned,
)
from fleet_events.session import (
    CoreMemoryChanged,
    CoreMemoryRefused,
    DocumentLoaded,
    InputExpired,
    InputProvided,
    InputRequested,
    TurnCompleted,
    TurnRequested,
    log_subject,
    run_subject,
    session_filter,
)
from fleet_events.session_fold import FOLD, answer_input, history
from fleet_harness.pdf import tiny_pdf
from fleet_harness.procs import Launcher
from fleet_harness.scripted_lm import Reply, ScriptedLM
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import ensure_keypair, load_private_key
from fleet_mesh.store import AppendConflict, EventStore

GATEWAY = Actor(service="gateway", replica="test")


def fields(**values: object) -> str:
    body = "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items())
    return body + "[[ ## completed ## ]]\n"


def cot(answer: str, needs_tools: bool = False, reasoning: str = "thinking") -> str:
    return fields(reasoning=reasoning, answer=answer, needs_tools=needs_tools)


def act(tool: str, args: str = "{}", thought: str = "next") -> str:
    return fields(next_thought=thought, next_tool_name=tool, next_tool_args=args)


def extract(answer: str) -> str:
    return fields(reasoning="from the trajectory", answer=answer)


@dataclass
class StandInEngine:
    """A FAKE of the recursive engine (module docstring): answers, or fails, as told."""

    answer: str = "the RLM's answer"
    status: str = "completed"
    code: str = ""
    error: str = "RuntimeError: the stand-in was told to fail"
    tasks: list[tuple[RlmTask, RunContext]] = field(default_factory=list)

    async def __call__(self, task: RlmTask, ctx: RunContext) -> RlmResult:
        self.tasks.append((task, ctx))
        if self.status != "completed":
            return RlmResult(status=self.status, error=self.error, code=self.code)
        return RlmResult(status="completed", answer=self.answer, head_hash="c0ffee" * 4)


async def no_sandbox(mesh: EngineMesh, tenant: str, session: str, turn: str) -> str:
    """A FAKE sandbox lookup for turns whose RLM is the stand-in (nothing runs in it)."""
    return "sandbox-of-the-stand-in"


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A server of the module's own, with one budget replica on it."""
    root = tmp_path_factory.mktemp("chat")
    server = NatsServer(store_dir=root / "store", sync_interval="2m", log_path=root / "nats.log")
    server.start()
    launcher = Launcher(nats_url=server.url, log_dir=root)
    launcher.start("budget")
    yield server
    launcher.stop_all()
    server.stop()


@pytest.fixture
async def mesh_nc(budget_server: NatsServer) -> AsyncIterator[Client]:
    from fleet_mesh.bootstrap import bootstrap
    from fleet_mesh.connection import connect

    client = await connect(budget_server.url, name="chat-test")
    await bootstrap(client.jetstream(), env={})

    async def ready() -> bool:
        try:
            pong = await rpc.call_verb(client, bus.ping("budget"), Ping(), timeout=0.5)
        except (NatsTimeout, NoRespondersError):
            return False
        return "concurrency" in pong.details

    await eventually(ready, timeout=30, what="a budget replica")
    yield client
    await client.close()


@pytest.fixture
async def pool(budget_server: NatsServer, tmp_path: Path) -> AsyncIterator[MeshPool]:
    key = load_private_key(ensure_keypair(tmp_path / "secrets").private)
    running = MeshPool(budget_server.url, Actor(service="agent", replica="chat-test"), key)
    yield running
    await asyncio.to_thread(running.close)


class Chat:
    """One tenant and session of the test's own: the profile, the log, the runner."""

    def __init__(self, nc: Client, pool: MeshPool) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.pool = pool
        self.tenant = f"t{new_id()[:10]}"
        self.session = new_id()
        self.store: EventStore | None = None
        self.ended: list[TurnState] = []

    async def open(self, fake: ScriptedLM) -> "Chat":
        blobs = await JetStreamBlobs.open(self.js)
        self.store = EventStore(self.js, streams.SESSIONS, LenientCodec(blobs))
        config = await LlmConfig.open(self.js)
        profile = LlmProfile(name="scripted", model="openai/scripted", api_base=fake.base_url)
        await config.put_profile(profile, tenant=self.tenant)
        await config.set_role("planner", profile.name, tenant=self.tenant)
        return self

    async def append(self, turn: str | None, event: Event) -> int:
        assert self.store is not None
        subject = log_subject(self.tenant, self.session)
        for _ in range(50):
            envelope = Envelope(
                id=new_id(), tenant=self.tenant, session=self.session, turn=turn,
                actor=GATEWAY, ts=utc_now(), data=event,
            )  # fmt: skip
            try:
                return (await self.store.append(subject, envelope)).seq
            except AppendConflict:
                continue
        raise AssertionError("the log kept moving")

    def runner(
        self, engine: StandInEngine | None = None, urls: UrlLoader | None = None, **options: Any
    ) -> ChatRunner:
        return ChatRunner(
            self.pool, RlmTask(inputs={}), ChatOptions(**options),
            engine=engine or StandInEngine(), sandbox_of=no_sandbox, urls=urls,
            on_turn_end=self.ended.append,
        )  # fmt: skip

    async def turn(
        self,
        message: str,
        *,
        mode: str = "auto",
        runner: ChatRunner | None = None,
        token: CancelToken | None = None,
        context_paths: tuple[str, ...] = (),
        **opts: Any,
    ) -> tuple[str, Answered | Stopped | Parked | Failed]:
        turn = new_id()
        request = TurnRequested(message=message, mode=mode, context_paths=context_paths)
        await self.append(turn, request)
        chosen = runner or self.runner(**opts)
        given = TurnInput(
            tenant=self.tenant, session=self.session, turn=turn, message=message, attempt=1,
            replica="chat-test",
        )  # fmt: skip
        return turn, await chosen.run(given, token or CancelToken())

    async def events(self, subject: str) -> list[Event]:
        assert self.store is not None
        return [stored.envelope.data async for stored in self.store.replay(subject)]

    async def run_events(self, turn: str) -> list[Event]:
        run = root_run_id(self.tenant, self.session, turn)
        return await self.events(run_subject(self.tenant, self.session, run))

    async def log(self) -> list[Event]:
        return await self.events(log_subject(self.tenant, self.session))

    async def fold(self) -> Any:
        assert self.store is not None
        return (await self.store.load(session_filter(self.tenant, self.session), FOLD)).state


def of(events: list[Event], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


@pytest.fixture
async def chat(mesh_nc: Client, pool: MeshPool) -> Chat:
    return Chat(mesh_nc, pool)


async def test_a_plain_question_is_answered_by_chain_of_thought_alone(chat: Chat) -> None:
    with ScriptedLM([cot("four")]) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn("What is two plus two?")
    assert isinstance(outcome, Answered)
    # no fallback line: the first module answered
    assert outcome == Answered("four", root_head_hash=outcome.root_head_hash, answered_by="cot")
    events = await chat.run_events(turn)
    assert isinstance(events[0], RunStarted)
    assert events[0].kind == "chat"
    assert of(events, Escalated) == []
    (call,) = of(events, LlmCalled)
    assert call.request_kind == "step"
    assert call.role == "planner"
    assert of(events, IterationPlanned)[0].llm_call == call.call_id
    assert isinstance(events[-1], RunCompleted)
    assert events[-1].outputs == {"module": "cot"}
    assert len(fake.requests) == 1


async def test_cot_asking_for_tools_escalates_to_react_which_edits_memory(chat: Chat) -> None:
    script = [
        cot("", needs_tools=True),
        act("core_memory_append", '{"block": "human", "text": "prefers tables"}'),
        act("finish"),
        extract("noted: you prefer tables"),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn("Keep in mind that I prefer tables.")
    assert isinstance(outcome, Answered)
    assert outcome.answer == "noted: you prefer tables"
    events = await chat.run_events(turn)
    (up,) = of(events, Escalated)
    assert (up.from_module, up.to_module, up.rule) == ("cot", "react", "tools_needed")
    assert "needs_tools=True" in up.detail
    (called,) = of(events, ToolCalled)
    (returned,) = of(events, ToolReturned)
    assert called.tool == returned.tool == "core_memory_append"
    assert called.call_id == returned.call_id
    assert called.args == {"block": "human", "text": "prefers tables"}
    assert returned.error == ""
    assert [p.tool for p in of(events, IterationPlanned)] == ["", "core_memory_append", "finish"]
    assert len(of(events, LlmCalled)) == 4
    assert all(c.request_kind == "step" for c in of(events, LlmCalled))
    (changed,) = of(await chat.log(), CoreMemoryChanged)
    assert changed.value == "prefers tables"


async def test_a_message_about_documents_goes_to_react_without_a_cot_call(chat: Chat) -> None:
    text = "line one\nthe secret word is heron\nline three\n"
    blobs = await JetStreamBlobs.open(chat.js)
    ref = await blobs.put(chat.tenant, text.encode())
    script = [
        act("load_document", f'{{"source": "upload:{ref.sha256}", "alias": "notes"}}'),
        act("find_in_document", '{"pattern": "secret"}'),
        act("finish"),
        extract("heron"),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn("What is the secret word in the uploaded document?")
    assert isinstance(outcome, Answered)
    assert outcome.answer == "heron"
    events = await chat.run_events(turn)
    (up,) = of(events, Escalated)
    assert up.rule == "tools_needed"
    assert "'uploaded'" in up.detail
    assert "next_tool_name" in fake.requests[0].prompt_text  # the first call was ReAct's
    found = [r for r in of(events, ToolReturned) if r.tool == "find_in_document"]
    assert found[0].result == "2: the secret word is heron"
    (loaded,) = of(await chat.log(), DocumentLoaded)
    assert loaded.document.alias == "notes"
    assert loaded.document.source == "upload"
    assert loaded.document.chars == len(text)


async def test_rlm_only_goes_straight_to_the_engine(chat: Chat) -> None:
    engine = StandInEngine(answer="42, by the RLM")
    with ScriptedLM([]) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn(
            "Count the lines", mode="rlm_only", runner=chat.runner(engine)
        )
    assert isinstance(outcome, Answered)
    assert outcome.answer == "42, by the RLM"
    events = await chat.run_events(turn)
    (up,) = of(events, Escalated)
    assert (up.from_module, up.to_module, up.rule) == ("cot", "rlm", "rlm_only")
    ((task, ctx),) = engine.tasks
    assert task.inputs["task"] == "Count the lines"
    assert ctx.depth == 1
    assert ctx.parent_run == root_run_id(chat.tenant, chat.session, turn)
    (asked,) = of(events, ChildRunRequested)
    (done,) = of(events, ChildRunCompleted)
    assert asked.child_run == done.child_run == ctx.run
    assert done.child_head_hash == "c0ffee" * 4
    assert fake.requests == []  # the chat run made no model call of its own


async def test_a_context_over_the_threshold_goes_to_the_rlm(chat: Chat) -> None:
    engine = StandInEngine()
    big = "x" * 33_000
    with ScriptedLM([]) as fake:
        await chat.open(fake)
        turn, _ = await chat.turn(f"Summarise: {big}", runner=chat.runner(engine))
    (up,) = of(await chat.run_events(turn), Escalated)
    assert (up.to_module, up.rule) == ("rlm", "context_over_threshold")
    assert "over the threshold of 32000" in up.detail
    assert len(engine.tasks) == 1


async def test_tools_only_never_reaches_the_rlm_whatever_the_context(chat: Chat) -> None:
    engine = StandInEngine()
    with ScriptedLM([cot("short answer")]) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn(
            "Summarise: " + "x" * 33_000, mode="tools_only", runner=chat.runner(engine)
        )
    assert isinstance(outcome, Answered)
    assert outcome.answer == "short answer"
    assert engine.tasks == []
    assert of(await chat.run_events(turn), Escalated) == []


async def test_a_failed_rlm_falls_back_to_react(chat: Chat) -> None:
    engine = StandInEngine(status="failed")
    with ScriptedLM([act("finish"), extract("answered without the RLM")]) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn("Summarise: " + "x" * 33_000, runner=chat.runner(engine))
    assert isinstance(outcome, Answered)
    assert outcome.answer == "answered without the RLM"
    events = await chat.run_events(turn)
    (down,) = of(events, FellBack)
    assert (down.from_module, down.to_module, down.reason) == ("rlm", "react", "rlm_failed")
    assert down.error == "RlmRouteFailed"
    (done,) = of(events, RunCompleted)
    assert done.outputs == {"module": "react"}
    # the answer says it is a fallback's, and why: where the user reads it, not only a trace row
    note = (
        "answered by ReAct (the tools) after the RLM failed: it broke (RlmRouteFailed; the "
        "turn's trace has the details)"
    )
    assert (done.answered_by, done.fallback) == ("react", note)
    assert (outcome.answered_by, outcome.fallback) == ("react", note)
    assert down.note == note


async def test_a_stated_rlm_failure_is_named_in_the_fallback_line(chat: Chat) -> None:
    engine = StandInEngine(status="failed", code="llm_timeout", error="the call took over 600 s")
    with ScriptedLM([act("finish"), extract("23, by ReAct")]) as fake:
        await chat.open(fake)
        _, outcome = await chat.turn("Summarise: " + "x" * 33_000, runner=chat.runner(engine))
    assert isinstance(outcome, Answered)
    assert outcome.fallback == (
        "answered by ReAct (the tools) after the RLM failed: the call took over 600 s (llm_timeout)"
    )


async def test_rlm_only_never_falls_back_the_turn_fails_with_the_rlms_reason(chat: Chat) -> None:
    engine = StandInEngine(status="failed", code="llm_timeout", error="the call took over 600 s")
    with ScriptedLM([cot("a guess from chain of thought")]) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn(
            "Count the lines", mode="rlm_only", runner=chat.runner(engine)
        )
        asked = len(fake.requests)
    assert isinstance(outcome, Failed)
    assert (outcome.code, outcome.error) == ("llm_timeout", "the call took over 600 s")
    events = await chat.run_events(turn)
    assert of(events, FellBack) == []
    assert of(events, RunCompleted) == []
    assert asked == 0  # no lower module was asked


async def test_react_failing_over_sandbox_files_is_not_answered_blind_by_cot(chat: Chat) -> None:
    script: list[Reply | str] = [
        Reply("the model server broke", status=500),
        cot("a blind guess", needs_tools=False),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn(
            "Which lines of haystack.txt mention NEEDLE?", context_paths=("haystack.txt",)
        )
        asked = len(fake.requests)
    assert isinstance(outcome, Failed)
    assert outcome.code == "llm_unavailable"
    assert of(await chat.run_events(turn), FellBack) == []
    assert asked == 1  # ReAct's failed step only: chain of thought, which cannot read the file,
    # was not asked


async def test_a_failed_react_step_falls_back_to_cot_which_does_not_escalate_again(
    chat: Chat,
) -> None:
    script: list[Reply | str] = [
        Reply("the model server broke", status=500),
        cot("a plain answer", needs_tools=True),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn("Read the file notes.txt")
    assert isinstance(outcome, Answered)
    assert outcome.answer == "a plain answer"
    events = await chat.run_events(turn)
    (down,) = of(events, FellBack)
    assert (down.from_module, down.to_module, down.reason) == ("react", "cot", "react_failed")
    assert down.error.startswith("LmCallFailed")
    assert len(of(events, Escalated)) == 1  # only the opening move to ReAct
    failed = [c for c in of(events, LlmCalled) if c.error]
    assert len(failed) == 1


async def test_cot_failing_fails_the_run_with_its_reason(chat: Chat) -> None:
    with ScriptedLM([Reply("down", status=500)]) as fake:
        await chat.open(fake)
        _, outcome = await chat.turn("What is two plus two?")
    assert isinstance(outcome, Failed)  # a model call's failure: its kind (test_llm_failures)
    assert (outcome.code, outcome.retryable) == ("llm_unavailable", True)
    turn_events = [e for e in await chat.log() if isinstance(e, TurnRequested)]
    assert len(turn_events) == 1
    run_failed = []
    for event in await chat.events(f"fleet.session.{chat.tenant}.{chat.session}.run.>"):
        if isinstance(event, RunFailed):
            run_failed.append(event)
    assert len(run_failed) == 1
    assert (run_failed[0].reason, run_failed[0].error) == ("llm_unavailable", outcome.error)


async def test_a_clarification_round_trip(chat: Chat) -> None:
    script = [
        act("ask_user", '{"question": "Which region?", "options": ["eu", "us"]}'),
        act("finish"),
        extract("deploying to eu"),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        running = asyncio.ensure_future(chat.turn("Deploy the code to production"))

        async def asked() -> InputRequested | None:
            return next(iter(of(await chat.log(), InputRequested)), None)

        question = await eventually(asked, timeout=30, what="the agent's question")
        assert question.options == ("eu", "us")
        state = await chat.fold()
        assert state.pending_input.request_id == question.request_id
        answer = answer_input(state, question.request_id, "eu please", option="eu")
        assert isinstance(answer, InputProvided)
        await chat.append(None, answer)
        turn, outcome = await asyncio.wait_for(running, 60)
    assert isinstance(outcome, Answered)
    assert outcome.answer == "deploying to eu"
    (returned,) = [r for r in of(await chat.run_events(turn), ToolReturned) if r.tool == "ask_user"]
    assert returned.result == "eu please (option: eu)"
    assert "eu please" in fake.requests[1].prompt_text  # the model saw the answer
    assert (await chat.fold()).pending_input is None


async def test_an_unanswered_question_expires_and_the_turn_goes_on(chat: Chat) -> None:
    script = [act("ask_user", '{"question": "Which region?"}'), act("finish"), extract("gave up")]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn("Deploy the code", clarify_timeout_s=0.2)
    assert isinstance(outcome, Answered)
    (expired,) = of(await chat.log(), InputExpired)
    (asked,) = of(await chat.log(), InputRequested)
    assert expired.request_id == asked.request_id
    (returned,) = [r for r in of(await chat.run_events(turn), ToolReturned) if r.tool == "ask_user"]
    assert "did not answer" in returned.error
    assert (await chat.fold()).pending_input is None


async def test_a_url_tool_call_to_loopback_is_refused_and_recorded(chat: Chat) -> None:
    script = [
        act("fetch_web_document", '{"url": "http://127.0.0.1:4222/"}'),
        act("finish"),
        extract("that address is not allowed"),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        turn, _ = await chat.turn("Load http://127.0.0.1:4222/ please")
    (returned,) = of(await chat.run_events(turn), ToolReturned)
    assert "loopback" in returned.error
    assert "only public internet addresses" in returned.error
    assert of(await chat.log(), DocumentLoaded) == []


async def test_the_state_restored_after_a_turn_equals_the_live_state(chat: Chat) -> None:
    blobs = await JetStreamBlobs.open(chat.js)
    ref = await blobs.put(chat.tenant, b"alpha\nbeta\n")
    script = [
        act("core_memory_append", '{"block": "persona", "text": "terse"}'),
        act("core_memory_append", '{"block": "human", "text": "Ada"}'),
        act("core_memory_replace", '{"block": "human", "old": "Ada", "new": "Ada L."}'),
        act("load_document", f'{{"source": "upload:{ref.sha256}", "alias": "a"}}'),
        act("load_document", f'{{"source": "upload:{ref.sha256}", "alias": "b"}}'),
        act("set_active_document", '{"alias": "a"}'),
        act("finish"),
        extract("done"),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        turn, outcome = await chat.turn("Remember me and load the documents")
    assert isinstance(outcome, Answered)
    await chat.append(turn, TurnCompleted(answer=outcome.answer))  # what the worker records
    (live,) = chat.ended
    restored = await chat.fold()
    image = restored.image
    assert image.core_memory == live.memory
    assert image.core_memory.human == "Ada L."
    assert image.core_memory.persona == "terse"
    assert [d.alias for d in image.documents] == list(live.documents) == ["b", "a"]
    assert image.active_document == live.active == "a"
    assert history(restored) == [
        *live.history,
        {"question": "Remember me and load the documents", "answer": "done"},
    ]


def _pdf_site(body: bytes) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/pdf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/reports/q3.pdf"


async def test_a_pdf_from_a_url_is_loaded_through_the_address_seam(chat: Chat) -> None:
    """Every test host is loopback: the loader's `admit` seam lets this one site count as
    public (the refusals are tests/unit/agent/test_urls.py)."""
    server, url = _pdf_site(tiny_pdf("Quarterly revenue rose"))
    site = ipaddress.ip_address("127.0.0.1")
    urls = UrlLoader(admit=lambda ip: ip == site or public_only(ip))
    script = [
        act("fetch_web_document", json.dumps({"url": url})),
        act("read_file_slice", '{"start_line": 1, "num_lines": 5}'),
        act("finish"),
        extract("revenue rose"),
    ]
    try:
        with ScriptedLM(script) as fake:
            await chat.open(fake)
            turn, outcome = await chat.turn(f"Read {url}", runner=chat.runner(urls=urls))
    finally:
        server.shutdown()
        server.server_close()
    assert isinstance(outcome, Answered)
    (loaded,) = of(await chat.log(), DocumentLoaded)
    assert loaded.document.alias == "q3.pdf"
    assert (loaded.document.source, loaded.document.media_type) == ("url", "application/pdf")
    assert loaded.document.origin == url
    sliced = [
        r for r in of(await chat.run_events(turn), ToolReturned) if r.tool == "read_file_slice"
    ]
    assert sliced[0].result == "1: Quarterly revenue rose\n[lines 1-1 of 1]"


async def test_a_cancel_while_waiting_for_the_user_stops_the_run(chat: Chat) -> None:
    token = CancelToken()
    with ScriptedLM(
        [act("ask_user", '{"question": "Which region?"}', thought="ask first")]
    ) as fake:
        await chat.open(fake)
        running = asyncio.ensure_future(chat.turn("Deploy the code", token=token))

        async def asked() -> InputRequested | None:
            return next(iter(of(await chat.log(), InputRequested)), None)

        await eventually(asked, timeout=30, what="the agent's question")
        token.cancel("the user gave up")
        turn, outcome = await asyncio.wait_for(running, 60)
    assert outcome == Stopped("ask first")
    events = await chat.run_events(turn)
    assert isinstance(events[-1], RunCancelled)
    assert events[-1].reason == "the user gave up"
    assert events[-1].partial_answer == "ask first"
    assert len(fake.requests) == 1  # no step after the cancel


async def test_rlm_query_batched_runs_each_task_as_a_child_run(chat: Chat) -> None:
    engine = StandInEngine(answer="child answer")
    script = [
        act("rlm_query_batched", '{"tasks": ["count a", "count b", "count c"], "context": "abc"}'),
        act("finish"),
        extract("three answers"),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        turn, _ = await chat.turn("Run these three code analyses", runner=chat.runner(engine))
    assert sorted(t.inputs["task"] for t, _ in engine.tasks) == ["count a", "count b", "count c"]
    assert {t.inputs["context"] for t, _ in engine.tasks} == {"abc"}
    events = await chat.run_events(turn)
    asked = of(events, ChildRunRequested)
    assert sorted(a.batch_index for a in asked) == [0, 1, 2]
    assert len({a.child_run for a in asked}) == 3
    assert len(of(events, ChildRunCompleted)) == 3
    (returned,) = [r for r in of(events, ToolReturned) if r.tool == "rlm_query_batched"]
    assert returned.result == ["child answer"] * 3


async def test_a_long_context_module_runs_on_the_engine_with_its_signature(chat: Chat) -> None:
    engine = StandInEngine()
    blobs = await JetStreamBlobs.open(chat.js)
    ref = await blobs.put(chat.tenant, b"error at 10:01\nok\nerror at 10:02\n")
    script = [
        act("load_document", f'{{"source": "upload:{ref.sha256}", "alias": "app.log"}}'),
        act("summarize_long_document", '{"focus": "errors"}'),
        act("finish"),
        extract("two errors"),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        await chat.turn("Summarise the uploaded log document", runner=chat.runner(engine))
    ((task, _),) = engine.tasks
    assert task.signature.startswith("document, focus -> summary")
    assert task.answer_field == "summary"
    assert task.inputs == {"document": "error at 10:01\nok\nerror at 10:02\n", "focus": "errors"}


async def test_tools_only_offers_no_recursion_tools(chat: Chat) -> None:
    with ScriptedLM([act("finish"), extract("fine")]) as fake:
        await chat.open(fake)
        await chat.turn("Read the file", mode="tools_only")
    offered = fake.requests[0].system
    assert "load_document" in offered
    for name in ("rlm_query", "delegate_to_rlm", "summarize_long_document"):
        assert name not in offered


async def test_a_refused_memory_change_is_recorded_and_told_to_the_model(chat: Chat) -> None:
    too_long = "x" * 1_001
    script = [
        act("core_memory_append", json.dumps({"block": "scratchpad", "text": too_long})),
        act("finish"),
        extract("could not note that"),
    ]
    with ScriptedLM(script) as fake:
        await chat.open(fake)
        turn, _ = await chat.turn("Put this in your memory scratchpad")
    (refused,) = of(await chat.log(), CoreMemoryRefused)
    assert (refused.block, refused.reason, refused.length) == ("scratchpad", "over_limit", 1_001)
    (returned,) = of(await chat.run_events(turn), ToolReturned)
    assert returned.error == refused.message
    assert f"error: {refused.message}" in fake.requests[1].prompt_text  # the model read why
    assert of(await chat.log(), CoreMemoryChanged) == []
