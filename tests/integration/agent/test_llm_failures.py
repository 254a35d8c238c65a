"""A failed model call ends the turn with its kind, not a generic `runner_error`: real turns on
the real mesh (agent replicas as processes, a real broker and budget service, sandboxes), the
scripted LM (a FAKE model server) answering 429 with or without `Retry-After`, 401, 500, a
context that does not fit, or nothing at all, and a profile whose server is not there.

Each test reads the stored `turn.failed` (code, retryable, message), the run's `run.failed`
and the failed call's `run.llm_called` (its `error_code`), for the chat agent (ChainOfThought
and ReAct), the RLM engine, and an `llm_query` made by code in a sandbox cell.
"""

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from fleet_events.llm import LlmProfile
from fleet_events.run import CellExecuted, FellBack, LlmCalled, RunCompleted, RunFailed
from fleet_events.session import TurnCompleted, TurnFailed
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsWriter, ensure_keypair, load_public_key

from .rlm_kit import Processes, Session, fields, of_type, session, start_mesh, step, stop_mesh

pytestmark = pytest.mark.slow

WRONG_KEY = "sk-wrong-7f3a9c2e4b1d"
ENGINE_ENV = {"FLEET_ENGINE_MAX_ITERS": "3", "FLEET_ENGINE_MAX_LLM_CALLS": "6"}


@pytest.fixture(scope="module")
def chat_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    running = start_mesh(
        tmp_path_factory.mktemp("llm-chat"), {"FLEET_AGENT_RUNNER": "chat", **ENGINE_ENV}
    )
    yield running
    stop_mesh(running)


@pytest.fixture(scope="module")
def rlm_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    running = start_mesh(
        tmp_path_factory.mktemp("llm-rlm"), {"FLEET_AGENT_RUNNER": "rlm", **ENGINE_ENV}
    )
    yield running
    stop_mesh(running)


def cot(answer: str) -> str:
    return fields(reasoning="thinking", answer=answer, needs_tools=False)


async def use(
    s: Session, base: str, *, roles: tuple[str, ...] = ("planner", "delegate"), **options: Any
) -> LlmProfile:
    """A profile `main` on `base` for `roles` of the session's tenant."""
    config = await LlmConfig.open(s.nc.jetstream())
    profile = LlmProfile(name="main", model="openai/scripted", api_base=base, **options)
    await config.put_profile(profile, tenant=s.tenant)
    for role in roles:
        await config.set_role(role, profile.name, tenant=s.tenant)
    return profile


async def failed_turn(s: Session, message: str) -> tuple[TurnFailed, list[Any]]:
    turn = await s.ask(message)
    ended = await s.ended(turn, timeout=90)
    assert isinstance(ended, TurnFailed), ended
    return ended, await s.run_events(turn)


def failed_calls(events: list[Any]) -> list[LlmCalled]:
    return [c for c in of_type(events, LlmCalled) if c.error]


def the_cells(events: list[Any]) -> list[CellExecuted]:
    """The cells the planner wrote (not the one that sets up dspy's facade in the REPL)."""
    return [c for c in of_type(events, CellExecuted) if "SUBQ" in c.code]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def chat(chat_mesh: Processes) -> AsyncIterator[Session]:
    async with session(chat_mesh) as s:
        yield s


@pytest.fixture
async def rlm(rlm_mesh: Processes) -> AsyncIterator[Session]:
    async with session(rlm_mesh) as s:
        yield s


# -- the fake fails the way providers fail ------------------------------------------------------


def test_the_fake_answers_retry_after_error_codes_and_hangs() -> None:
    script = [
        Reply("slow down", status=429, retry_after=2),
        Reply("too long", status=400, error_code="context_length_exceeded"),
        Reply("never", hang=True),
    ]
    with ScriptedLM(script) as fake:
        url = f"{fake.base_url}/chat/completions"
        body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
        limited = httpx.post(url, json=body)
        assert (limited.status_code, limited.headers["retry-after"]) == (429, "2")
        long = httpx.post(url, json=body)
        assert long.json()["error"]["code"] == "context_length_exceeded"
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=body, timeout=0.5)
        assert fake.calls == {"hi": 3}


# -- the chat agent ----------------------------------------------------------------------------


async def test_a_rate_limit_without_retry_after_ends_the_chat_turn_llm_rate_limited(
    chat: Session,
) -> None:
    with ScriptedLM([Reply("Rate limit reached for requests", status=429)]) as fake:
        await use(chat, fake.base_url)
        ended, events = await failed_turn(chat, "What is two plus two?")
    assert (ended.code, ended.retryable) == ("llm_rate_limited", True)
    assert ended.error == (
        "the provider of the model 'openai/scripted' of profile 'main' (role planner) is "
        "rate-limiting calls (HTTP 429): the provider asked to slow down; retry in a while, or "
        "raise the rate limit of the account behind profile 'main'"
    )
    assert len(fake.requests) == 1  # no Retry-After: not asked again
    (call,) = failed_calls(events)
    assert (call.error_code, call.retry_in_s) == ("llm_rate_limited", 0.0)
    assert "Rate limit reached for requests" in call.error  # the provider's text stays here
    (run_failed,) = of_type(events, RunFailed)
    assert (run_failed.reason, run_failed.retryable) == ("llm_rate_limited", True)


async def test_a_short_retry_after_is_waited_out_and_asked_again_as_a_call_of_its_own(
    chat: Session,
) -> None:
    script: list[Reply | str] = [Reply("slow down", status=429, retry_after=1), cot("4")]
    with ScriptedLM(script) as fake:
        await use(chat, fake.base_url)
        turn = await chat.ask("What is two plus two?")
        ended = await chat.ended(turn, timeout=90)
        events = await chat.run_events(turn)
        tree = await chat.tree(turn)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "4"
    first, second = of_type(events, LlmCalled)
    assert (first.error_code, first.retry_in_s) == ("llm_rate_limited", 1.0)
    assert (second.error, second.error_code) == ("", "")
    assert first.request_hash == second.request_hash  # the same request, asked again
    assert first.grant_id != second.grant_id  # each attempt was granted by the budget
    assert tree.calls_recorded == 2  # both attempts were charged to the tree
    assert len(fake.requests) == 2
    assert isinstance(events[-1], RunCompleted)


async def test_a_long_retry_after_is_not_waited_for_and_the_message_says_when(
    chat: Session,
) -> None:
    with ScriptedLM([Reply("slow down", status=429, retry_after=30)]) as fake:
        await use(chat, fake.base_url)
        ended, events = await failed_turn(chat, "What is two plus two?")
    assert ended.code == "llm_rate_limited"
    assert "the provider asked to slow down; retry after 30 s" in ended.error
    assert len(fake.requests) == 1
    assert [c.retry_in_s for c in failed_calls(events)] == [0.0]


async def test_a_refused_key_ends_the_turn_without_falling_back_or_showing_the_key(
    chat: Session, chat_mesh: Processes
) -> None:
    """ReAct's step is refused (401): a fallback to ChainOfThought would send the same key to
    the same server, so the turn ends there, naming the profile's secret, never the key."""
    keys = ensure_keypair(chat_mesh.sandboxes.parent / "secrets")
    writer = await SecretsWriter.open(chat.nc.jetstream(), load_public_key(keys.public))
    await writer.put("llm-main", WRONG_KEY, tenant=chat.tenant)
    with ScriptedLM(["never answered"], api_key="the-right-key") as fake:
        await use(chat, fake.base_url, secret="llm-main")
        ended, events = await failed_turn(chat, "Read the file notes.txt and summarise it")
    assert (ended.code, ended.retryable) == ("llm_auth_failed", False)
    assert ended.error == (
        "the provider refused the key for the model 'openai/scripted' of profile 'main' (role "
        "planner), HTTP 401: check the api_key of profile 'main' (its secret 'llm-main') and "
        "that the key may use this model"
    )
    assert fake.refused_auth == 1  # asked once: no fallback, no retry
    assert of_type(events, FellBack) == []
    (call,) = failed_calls(events)
    assert call.error_code == "llm_auth_failed"
    everything = repr(ended) + repr(events)
    assert WRONG_KEY not in everything


async def test_a_model_that_never_answers_ends_the_turn_llm_timeout(chat: Session) -> None:
    with ScriptedLM([Reply("never", hang=True)]) as fake:
        await use(chat, fake.base_url, timeout_s=1.0)
        ended, events = await failed_turn(chat, "What is two plus two?")
    assert (ended.code, ended.retryable) == ("llm_timeout", True)
    assert "did not answer within the profile's timeout of 1 s" in ended.error
    assert "raise timeout_s of profile 'main'" in ended.error
    assert [c.error_code for c in failed_calls(events)] == ["llm_timeout"]


async def test_a_server_that_is_not_there_ends_the_turn_llm_unreachable(chat: Session) -> None:
    base = f"http://127.0.0.1:{closed_port()}/v1"
    await use(chat, base)
    ended, events = await failed_turn(chat, "What is two plus two?")
    assert (ended.code, ended.retryable) == ("llm_unreachable", True)
    assert f"the server of profile 'main' at {base} cannot be reached" in ended.error
    assert [c.error_code for c in failed_calls(events)] == ["llm_unreachable"]


async def test_a_server_error_ends_the_turn_llm_unavailable(chat: Session) -> None:
    with ScriptedLM([Reply("the model server broke", status=500)]) as fake:
        await use(chat, fake.base_url)
        ended, _ = await failed_turn(chat, "What is two plus two?")
    assert (ended.code, ended.retryable) == ("llm_unavailable", True)
    assert "failed, HTTP 500: it is down or overloaded; ask again later" in ended.error
    assert "the model server broke" not in ended.error  # the provider's text stays recorded


async def test_a_prompt_over_the_context_window_ends_the_turn_llm_context_exceeded(
    chat: Session,
) -> None:
    too_long = Reply("maximum context length", status=400, error_code="context_length_exceeded")
    with ScriptedLM([too_long]) as fake:
        await use(chat, fake.base_url)
        ended, _ = await failed_turn(chat, "What is two plus two?")
    assert (ended.code, ended.retryable) == ("llm_context_exceeded", False)
    assert "shorten the message" in ended.error


# -- the RLM engine ----------------------------------------------------------------------------


async def test_an_rlm_step_refused_ends_the_turn_llm_auth_failed(rlm: Session) -> None:
    with ScriptedLM([Reply("Incorrect API key provided", status=401)]) as fake:
        await use(rlm, fake.base_url)
        ended, events = await failed_turn(rlm, "Count to three")
    assert (ended.code, ended.retryable) == ("llm_auth_failed", False)
    assert "profile 'main' sends no key: store its api_key" in ended.error
    (run_failed,) = of_type(events, RunFailed)
    assert (run_failed.reason, run_failed.error) == ("llm_auth_failed", ended.error)
    assert [c.error_code for c in failed_calls(events)] == ["llm_auth_failed"]


def sub_call_fails(first_step: str, failure: Reply) -> Any:
    """The planner writes `first_step`, every `llm_query('SUBQ')` gets `failure`, and the
    planner's later steps get `failure` too when it is a refusal of the key (the same key)."""
    steps = [first_step]

    def answer(request: ScriptedRequest) -> Reply | str:
        if request.last_user == "SUBQ":
            return Reply(failure.text, key="sub", status=failure.status)
        if steps:
            return Reply(steps.pop(), key="step")
        return Reply(failure.text, key="step", status=failure.status)

    return answer


async def test_a_cells_llm_query_failure_reaches_the_code_with_its_kind(rlm: Session) -> None:
    code = "try:\n    llm_query('SUBQ')\nexcept Exception as exc:\n    SUBMIT(answer=str(exc))"
    limited = Reply("Rate limit reached", status=429)
    with ScriptedLM(sub_call_fails(step(code), limited)) as fake:
        await use(rlm, fake.base_url)
        turn = await rlm.ask("Ask a sub model")
        ended = await rlm.ended(turn, timeout=90)
        events = await rlm.run_events(turn)
    assert isinstance(ended, TurnCompleted), ended
    assert "llm_rate_limited: the provider of the model 'openai/scripted'" in ended.answer
    assert "(role delegate)" in ended.answer
    (call,) = failed_calls(events)
    (cell,) = the_cells(events)
    assert (call.error_code, call.request_kind, call.cell) == (
        "llm_rate_limited", "sub", cell.cell_id,
    )  # fmt: skip
    # the record holds the words the code saw: what `fleet replay` answers this call with
    assert call.error_shown
    assert ended.answer.endswith(call.error_shown)
    assert fake.calls == {"step": 1, "sub": 1}


async def test_a_run_that_fails_after_its_cells_llm_query_was_refused_ends_with_that_kind(
    rlm: Session,
) -> None:
    """The key is refused in the cell (uncaught: the cell errs with the kind in its text) and
    then at the planner's next step: the run fails, and the turn says why."""
    refused = Reply("Incorrect API key provided", status=401)
    with ScriptedLM(sub_call_fails(step("print(llm_query('SUBQ'))"), refused)) as fake:
        await use(rlm, fake.base_url)
        ended, events = await failed_turn(rlm, "Ask a sub model")
    assert (ended.code, ended.retryable) == ("llm_auth_failed", False)
    (cell,) = the_cells(events)
    assert "llm_auth_failed: the provider refused the key" in cell.error
    assert [c.error_code for c in failed_calls(events)] == ["llm_auth_failed"] * 2
    assert fake.calls == {"step": 2, "sub": 1}
    (run_failed,) = of_type(events, RunFailed)
    assert run_failed.reason == "llm_auth_failed"
