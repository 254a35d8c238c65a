"""Agent benchmark (issue 9), side by side in one run, against the scripted LM (a FAKE
OpenAI-compatible model server in this process on loopback, answering from a script):

1. A scripted 10-iteration RLM trajectory (20 `llm_query`, 2 `sub_rlm`) as a turn through
   the mesh (a real agent process, `FLEET_AGENT_RUNNER=rlm`, with a real sandbox broker and
   budget; the bench appends `TurnRequested` and stops the clock at `TurnCompleted`) beside
   the same `dspy.RLM` in this process on `dspy.LocalInterpreter`, its `sub_rlm` a nested
   `dspy.RLM` on a LocalInterpreter of its own. At zero model latency the difference per
   iteration is the mesh's overhead, with a profile of the mesh run taken from its own record
   (the events' timestamps, durations and latencies); at 100 ms the wall ratio.
2. Turns per second with 2 agent replicas against 1 (the chat agent, one 200 ms model call per
   turn, `FLEET_AGENT_TURN_SLOTS` fixed per replica), a backlog of at least twice the total
   slots appended at once; CPU-seconds per turn per process, and each replica's slot occupancy
   (the turns' started-to-ended time over slots x window), so a saturated replica shows.
3. `TurnRequested` stored -> `TurnStarted` stored, p50 and p99 (`bench/turns.py`, reused).
4. The fork-ready cell's checkpoint: a trivial cell on a fork-ready sandbox and on a
   `fork_ready=False` one, and that difference against the mesh's cell time per iteration.

Run: `.venv/bin/python bench/agent.py [--quick]`. Goals are printed beside the figures, never
asserted. `--compare-with TREE` runs only part 1, through two meshes: the agent of another
checkout (`mkdir /tmp/head && git archive HEAD | tar -x -C /tmp/head`) as the baseline, this
tree's as the project, turns alternated, so a change is measured as a ratio under one load.
Each part starts its own nats-server and processes and stops them.
"""

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# the bench's model server is a fake on loopback, and a tenant's profile may reach public
# addresses only: this bench deployment allows loopback, as the suite does (conftest.py)
os.environ.setdefault("FLEET_EGRESS_ALLOW", "127.0.0.0/8")

import dspy
from dspy.clients.engines.litellm_engine import LiteLLMEngine
from dspy.primitives.local_interpreter import LocalInterpreter
from nats.aio.client import Client
from nats.aio.msg import Msg

from fleet_agent.engine import root_run_id
from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import Actor, Envelope, Event, bus, new_id, streams, utc_now
from fleet_events.bus import Ping
from fleet_events.chain import TYPE_HEADER
from fleet_events.codec import Codec
from fleet_events.llm import LlmProfile
from fleet_events.run import (
    CellExecuted,
    LlmCalled,
    RunCompleted,
    RunStarted,
    ToolReturned,
)
from fleet_events.session import (
    TurnCompleted,
    TurnFailed,
    TurnRequested,
    TurnStarted,
    log_subject,
    run_subject,
)
from fleet_harness import bench as side
from fleet_harness.procs import Replica, start_answering
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import ensure_keypair
from fleet_mesh.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
import turns as turns_bench  # bench/turns.py, reused for part 3

MODEL = "openai/scripted"
GATEWAY = Actor(service="gateway", replica="bench")
ITERS = 10
LLM_QUERIES_PER_STEP = 2
CHILD_AT = {3: 1, 6: 2}  # iteration -> the child it asks for (2 sub_rlm)
STEP = re.compile(r"# step (\d+)")
TICK = os.sysconf("SC_CLK_TCK")


# -- the scripted trajectory, shared by both sides ----------------------------------------------


def fields(**values: object) -> str:
    body = "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items())
    return body + "[[ ## completed ## ]]\n"


def action(code: str) -> str:
    return fields(reasoning="next", code=f"```python\n{code}\n```")


def step_code(k: int) -> str:
    lines = [f"# step {k}"]
    lines += [f"q{k}_{j} = llm_query('LLMQ {k} {j}')" for j in range(LLM_QUERIES_PER_STEP)]
    if k in CHILD_AT:
        # by keyword: dspy's own LocalInterpreter fails a positional call of an RLM-wrapped
        # tool ("takes 0 positional arguments"); RemoteInterpreter binds it (either works)
        lines.append(f"c{CHILD_AT[k]} = sub_rlm(task='CHILD TASK {CHILD_AT[k]}')")
    if k == ITERS - 1:
        lines.append("SUBMIT(answer=c1 + '+' + c2)")
    else:
        lines.append(f"print(q{k}_0)")
    return "\n".join(lines)


def trajectory(request: ScriptedRequest) -> Reply:
    """llm_query prompts answer `ok`; the root (its task says ROOT) takes step k+1 after the
    last `# step k` its history shows; a child (CHILD TASK n) submits at once."""
    user = request.last_user
    if user.startswith("LLMQ"):
        return Reply("ok", key="llm_query")
    text = request.prompt_text
    if "ROOT bench" not in text:
        child = re.search(r"CHILD TASK (\d)", text)
        assert child, "a request from neither the root nor a child"
        return Reply(action(f"SUBMIT(answer='child{child.group(1)}')"), key="child")
    done = [int(k) for k in STEP.findall(text)]
    k = max(done) + 1 if done else 0
    return Reply(action(step_code(k)), key=f"step-{k}")


EXPECTED_ANSWER = "child1+child2"


# -- in process: dspy.RLM on LocalInterpreter ----------------------------------------------------


def plain_lm(fake: ScriptedLM) -> Any:
    engine = LiteLLMEngine(api_key="unused", api_base=fake.base_url, wire_model=MODEL)
    return dspy.LM(MODEL, engine=engine, cache=False, num_retries=0)


def in_process(fake: ScriptedLM) -> Callable[[], str]:
    lm = plain_lm(fake)
    adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)

    def sub_rlm(task: str) -> str:
        """A child RLM run on the task; returns its answer."""
        child = dspy.RLM(
            "task -> answer", max_iters=ITERS, max_llm_calls=50, sub_lm=lm,
            interpreter_factory=LocalInterpreter,
        )  # fmt: skip
        with dspy.context(lm=lm, adapter=adapter):
            return str(child(task=task).answer)

    root = dspy.RLM(
        "task -> answer", max_iters=ITERS, max_llm_calls=50, sub_lm=lm, tools=[sub_rlm],
        interpreter_factory=LocalInterpreter,
    )  # fmt: skip

    def run() -> str:
        with dspy.context(lm=lm, adapter=adapter):
            return str(root(task="ROOT bench: follow the steps").answer)

    return run


# -- through the mesh --------------------------------------------------------------------------


@dataclass
class Mesh:
    server: NatsServer
    replicas: list[Replica] = field(default_factory=list)

    def stop(self) -> None:
        for replica in reversed(self.replicas):
            replica.stop()
        self.server.stop()


def start_mesh(root: Path, agent_env: dict[str, str], agents: int, broker: bool) -> Mesh:
    server = NatsServer(
        store_dir=root / "nats", sync_interval="always", log_path=root / "nats.log"
    ).start()
    mesh = Mesh(server)
    keys = ensure_keypair(root / "secrets")
    try:
        if broker:
            mesh.replicas.append(
                start_answering(
                    "sandbox-broker", server.url, root / "broker.log",
                    {
                        "FLEET_SANDBOX_ROOT": str(root / "sandboxes"),
                        "FLEET_SANDBOX_UID_BASE": "370000", "FLEET_SANDBOX_UID_COUNT": "512",
                    },
                )
            )  # fmt: skip
        mesh.replicas.append(start_answering("budget", server.url, root / "budget.log", {}))
        env = {
            "FLEET_SECRETS_KEY": str(keys.private),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            **agent_env,
        }
        for index in range(agents):
            mesh.replicas.append(
                start_answering("agent", server.url, root / f"agent-{index}.log", env)
            )
    except BaseException:
        mesh.stop()
        raise
    return mesh


async def use_model(nc: Client, tenant: str, fake: ScriptedLM) -> None:
    config = await LlmConfig.open(nc.jetstream())
    profile = LlmProfile(name="scripted", model=MODEL, api_base=fake.base_url)
    await config.put_profile(profile, tenant=tenant)
    for role in ("planner", "delegate"):
        await config.set_role(role, profile.name, tenant=tenant)


class Turns:
    """The gateway's part: append `TurnRequested` in a new session, and hear its end (a core
    subscription on the tenant's logs: the stream delivers a message as it stores it)."""

    def __init__(self, nc: Client, tenant: str) -> None:
        self.nc = nc
        self.tenant = tenant
        self.ends: dict[str, asyncio.Future[float]] = {}
        self.starts: dict[str, float] = {}
        self._sub: Any = None

    async def open(self) -> "Turns":
        self.store = await open_store(self.nc.jetstream(), streams.SESSIONS)
        self.codec = Codec(await JetStreamBlobs.open(self.nc.jetstream()))

        async def on_log(msg: Msg) -> None:
            kind = (msg.headers or {}).get(TYPE_HEADER, "")
            session = msg.subject.split(".")[3]
            if kind == "turn.started":
                self.starts.setdefault(session, time.perf_counter())
            if kind in ("turn.completed", "turn.failed", "turn.cancelled"):
                future = self.ends.get(session)
                if future is not None and not future.done():
                    future.set_result(time.perf_counter())

        self._sub = await self.nc.subscribe(f"fleet.session.{self.tenant}.*.log", cb=on_log)
        await self.nc.flush()
        return self

    async def ask(self, message: str) -> tuple[str, str, asyncio.Future[float]]:
        session, turn = new_id(), new_id()
        ended = self.ends[session] = asyncio.get_running_loop().create_future()
        envelope = Envelope(
            id=new_id(), tenant=self.tenant, session=session, turn=turn, actor=GATEWAY,
            ts=utc_now(), data=TurnRequested(message=message),
        )  # fmt: skip
        await self.store.append(log_subject(self.tenant, session), envelope)
        return session, turn, ended

    async def read(self, subject: str) -> list[Envelope[Any]]:
        return [
            await self.codec.decode(raw.data, tenant=self.tenant)
            async for raw in self.store.read_raw(subject)
        ]


def ms(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds() * 1000


@dataclass
class Profile:
    """Where one mesh run's time went, from its record (ms)."""

    turn_wall: float = 0.0
    dispatch: float = 0.0  # TurnRequested -> TurnStarted (stored)
    setup: float = 0.0  # TurnStarted -> run.started: tree open, session sandbox
    run_wall: float = 0.0  # run.started -> run.completed
    step_model: float = 0.0  # the model's own time in the run's step calls (latency_ms)
    sub_model: float = 0.0  # ... in llm_query calls
    children: float = 0.0  # sub_rlm tool calls, end to end (build_child, the child run, wait)
    cells: float = 0.0  # cell_executed.duration_ms, host tool time included
    teardown: float = 0.0  # run.completed -> TurnCompleted: tree close, the end's append
    llm_calls: int = 0
    cells_run: int = 0
    query_overhead: float = 0.0  # per llm_query beyond its model time (median, see below)
    step_overhead: float = 0.0  # per step call beyond its model time (median)

    @property
    def cell_overhead(self) -> float:
        """Cell time that is neither a model call nor a child: the sandbox round trip, the
        variables, the relays and records of the host calls."""
        return self.cells - self.sub_model - self.children

    @property
    def outside_cells(self) -> float:
        """Run time outside cells and step model calls: grants, records, dspy's own work."""
        return self.run_wall - self.cells - self.step_model


async def ended_log(turns: Turns, session: str) -> list[Envelope[Any]]:
    """The session's log once a read of it holds the turn's end: the end is heard on the core
    subscription a moment before every read of the stream is sure to return it."""

    async def read() -> list[Envelope[Any]] | None:
        log = await turns.read(log_subject(turns.tenant, session))
        return log if any(isinstance(e.data, TurnCompleted | TurnFailed) for e in log) else None

    return await eventually(read, timeout=10, what=f"the end of session {session}'s turn")


async def profile_of(turns: Turns, session: str, turn: str) -> Profile:
    log = await ended_log(turns, session)
    run = root_run_id(turns.tenant, session, turn)
    events = await turns.read(run_subject(turns.tenant, session, run))
    at: dict[type[Any], datetime] = {}
    for envelope in log:
        at.setdefault(type(envelope.data), envelope.ts)
    for envelope in events:
        at.setdefault(type(envelope.data), envelope.ts)
    end = next(e.ts for e in log if isinstance(e.data, TurnCompleted | TurnFailed))
    last = next(e.ts for e in reversed(events) if isinstance(e.data, RunCompleted))
    p = Profile(
        turn_wall=ms(at[TurnRequested], end), dispatch=ms(at[TurnRequested], at[TurnStarted]),
        setup=ms(at[TurnStarted], at[RunStarted]), run_wall=ms(at[RunStarted], last),
        teardown=ms(last, end),
    )  # fmt: skip
    p.query_overhead, p.step_overhead = call_overheads(events)
    for envelope in events:
        data: Event = envelope.data
        if isinstance(data, LlmCalled):
            p.llm_calls += 1
            if data.request_kind == "step":
                p.step_model += data.latency_ms
            else:
                p.sub_model += data.latency_ms
        elif isinstance(data, CellExecuted):
            p.cells += data.duration_ms
            p.cells_run += 1
        elif isinstance(data, ToolReturned) and data.tool.startswith("sub_rlm"):
            p.children += data.duration_ms
    return p


def call_overheads(events: list[Envelope[Any]]) -> tuple[float, float]:
    """Per call, what the mesh adds to a model call, from the record's timestamps (each
    `run.llm_called` is stamped as the call returns): for the second `llm_query` of a cell,
    the time since the first one's record less its own model time (the first's record and
    usage, the relay back into the sandbox and out again, the grant); for a step call, the
    time since the last cell's record less its model time (the grant, the prompt, the
    record of the plan before it). Medians, in ms."""
    queries: list[float] = []
    steps: list[float] = []
    last_query: dict[str, datetime] = {}
    last_cell: datetime | None = None
    for envelope in events:
        data = envelope.data
        if isinstance(data, LlmCalled) and data.request_kind != "step" and data.cell:
            before = last_query.get(data.cell)
            if before is not None:
                queries.append(ms(before, envelope.ts) - data.latency_ms)
            last_query[data.cell] = envelope.ts
        elif isinstance(data, LlmCalled) and data.request_kind == "step" and last_cell:
            steps.append(ms(last_cell, envelope.ts) - data.latency_ms)
        elif isinstance(data, CellExecuted):
            last_cell = envelope.ts
    median = statistics.median
    return (median(queries) if queries else 0.0), (median(steps) if steps else 0.0)


def mean_profile(profiles: list[Profile]) -> Profile:
    out = Profile()
    for name in Profile.__dataclass_fields__:
        values = [getattr(p, name) for p in profiles]
        setattr(out, name, statistics.fmean(values))
    return out


def print_profile(p: Profile, baseline_ms: float) -> None:
    per = 1 / ITERS
    rows = [
        ("TurnRequested -> TurnStarted (dispatch, work item, fold)", p.dispatch),
        ("TurnStarted -> run.started (tree open, session sandbox)", p.setup),
        ("run: model time of the step calls", p.step_model),
        ("run: model time of llm_query calls", p.sub_model),
        ("run: sub_rlm calls (fork, child work item, child run, wait)", p.children),
        ("run: cells minus their model calls and children", p.cell_overhead),
        ("run: outside cells and step calls (grants, records, dspy)", p.outside_cells),
        ("run.completed -> TurnCompleted (tree close, the end)", p.teardown),
    ]
    print(f"   profile of the mesh run (mean of the samples; {p.llm_calls:.0f} LM calls, "
          f"{p.cells_run:.0f} cells recorded):")  # fmt: skip
    print(f"   {'':62} {'ms':>9} {'ms/iter':>9}")
    for label, value in rows:
        print(f"   {label:62} {value:9.2f} {value * per:9.2f}")
    print(f"   {'turn, end to end (its events)':62} {p.turn_wall:9.2f} {p.turn_wall * per:9.2f}")
    print(f"   {'the same trajectory in process (p50)':62} {baseline_ms:9.2f} "
          f"{baseline_ms * per:9.2f}", flush=True)  # fmt: skip
    print(f"   per call, beyond the model's own time (median): an llm_query "
          f"{p.query_overhead:.2f} ms (its record and usage, the relay out of the sandbox and "
          f"back, the grant); a step call {p.step_overhead:.2f} ms since the last cell's record "
          "(the grant, the prompt, the plan's record)", flush=True)  # fmt: skip


async def one_latency(nc: Client, samples: int, latency: float) -> Profile:
    """Both sides at one model latency, interleaved; prints the comparison and the profile."""
    tenant = f"b{new_id()[:8]}"
    profiles: list[Profile] = []
    with ScriptedLM(trajectory, latency_s=latency) as fake:
        await use_model(nc, tenant, fake)
        turns = await Turns(nc, tenant).open()
        base_run = in_process(fake)

        async def baseline() -> None:
            answer = await asyncio.to_thread(base_run)
            assert answer == EXPECTED_ANSWER, answer

        async def project() -> None:
            session, turn, ended = await turns.ask("ROOT bench: follow the steps")
            await asyncio.wait_for(ended, 300)
            profiles.append(await profile_of(turns, session, turn))

        base, proj = await side.side_by_side(baseline, project, samples=samples, warmup=1, block=1)
        calls = dict(fake.calls)
    title = (
        f"a {ITERS}-iteration RLM trajectory ({ITERS * LLM_QUERIES_PER_STEP} llm_query, "
        f"{len(CHILD_AT)} sub_rlm), model latency {latency * 1000:.0f} ms: in process on "
        "LocalInterpreter vs a turn through the mesh"
    )
    goal = "overhead <= 10 ms per iteration" if latency == 0 else "<= 1.15x wall"
    side.report(title, base, proj, goal=goal, unit="run")
    overhead = (proj.p50_ms - base.p50_ms) / ITERS
    print(f"   mesh overhead per iteration (p50 difference / {ITERS}): {overhead:.2f} ms   "
          f"model calls seen (both sides): {calls}")  # fmt: skip
    measured = mean_profile(profiles[1:] or profiles)  # the warmup run excluded
    print_profile(measured, base.p50_ms)
    return measured


async def trajectory_part(
    root: Path, samples: int, latencies: list[float], cell_samples: int
) -> None:
    """Part 1, then part 4 on the same broker."""
    env = {
        "FLEET_AGENT_RUNNER": "rlm", "FLEET_AGENT_TURN_SLOTS": "1",
        "FLEET_ENGINE_CHILD_SLOTS": "2", "FLEET_ENGINE_MAX_ITERS": str(ITERS),
        "FLEET_ENGINE_MAX_LLM_CALLS": "50",
    }  # fmt: skip
    mesh = await asyncio.to_thread(start_mesh, root / "trajectory", env, 1, True)
    cell_per_iter = 0.0
    try:
        nc = await connect(mesh.server.url, name="bench-agent")
        try:
            for latency in latencies:
                measured = await one_latency(nc, samples, latency)
                if latency == 0:
                    cell_per_iter = measured.cell_overhead / ITERS
        finally:
            await nc.close()
        await checkpoint_part(mesh, cell_samples, cell_per_iter)
    finally:
        await asyncio.to_thread(mesh.stop)


# -- --compare-with: another tree's agent, side by side ---------------------------------------


SOURCE_ROOTS = ("libs/*/src", "apps/*/src", "services/*/src")


def pythonpath_of(tree: Path) -> str:
    """The source folders of another checkout of this project, first on an agent's path, so
    the process runs that tree's code (the venv's editable installs come after them)."""
    found = [str(p) for pattern in SOURCE_ROOTS for p in sorted(tree.glob(pattern))]
    if not found:
        raise SystemExit(f"--compare-with {tree}: no {', '.join(SOURCE_ROOTS)} there")
    return ":".join(found)


async def compare_part(root: Path, other: Path, samples: int, latencies: list[float]) -> None:
    """Part 1's trajectory through two meshes, the agent of `other` (e.g. `git archive HEAD`
    unpacked) as the baseline and this tree's as the project, turns alternated, so a change's
    effect is read as a ratio under the same load."""
    env = {
        "FLEET_AGENT_RUNNER": "rlm", "FLEET_AGENT_TURN_SLOTS": "1",
        "FLEET_ENGINE_CHILD_SLOTS": "2", "FLEET_ENGINE_MAX_ITERS": str(ITERS),
        "FLEET_ENGINE_MAX_LLM_CALLS": "50",
    }  # fmt: skip
    meshes = [
        await asyncio.to_thread(
            start_mesh, root / "other", {**env, "PYTHONPATH": pythonpath_of(other)}, 1, True
        ),
        await asyncio.to_thread(start_mesh, root / "this", env, 1, True),
    ]
    try:
        conns = [await connect(m.server.url, name="bench-compare") for m in meshes]
        try:
            for latency in latencies:
                await compare_at(conns, other, samples, latency)
        finally:
            for nc in conns:
                await nc.close()
    finally:
        for mesh in meshes:
            await asyncio.to_thread(mesh.stop)


async def compare_at(conns: list[Client], other: Path, samples: int, latency: float) -> None:
    profiles: list[list[Profile]] = [[], []]
    with ScriptedLM(trajectory, latency_s=latency) as fake:
        sides = []
        for nc in conns:
            tenant = f"b{new_id()[:8]}"
            await use_model(nc, tenant, fake)
            sides.append(await Turns(nc, tenant).open())

        def turn(index: int) -> Callable[[], Any]:
            async def run() -> None:
                session, turn, ended = await sides[index].ask("ROOT bench: follow the steps")
                await asyncio.wait_for(ended, 300)
                profiles[index].append(await profile_of(sides[index], session, turn))

            return run

        base, proj = await side.side_by_side(turn(0), turn(1), samples=samples, warmup=1, block=1)
    side.report(
        f"the {ITERS}-iteration trajectory at {latency * 1000:.0f} ms through the mesh: the "
        f"agent of {other} (baseline) vs this tree's (project)",
        base, proj, goal="a change's effect (below 1: this tree is faster)", unit="run",
    )  # fmt: skip
    for name, measured in zip(("baseline", "project"), profiles, strict=True):
        p = mean_profile(measured[1:] or measured)
        print(f"   {name}: per iteration: cells less model and children "
              f"{p.cell_overhead / ITERS:.2f} ms, outside cells {p.outside_cells / ITERS:.2f} ms, "
              f"children {p.children / ITERS:.2f} ms; per call beyond the model: llm_query "
              f"{p.query_overhead:.2f} ms, step {p.step_overhead:.2f} ms", flush=True)  # fmt: skip


# -- part 2: replicas --------------------------------------------------------------------------


COT = fields(reasoning="easy", answer="four", needs_tools="False")


def cpu_s(pid: int) -> float:
    """User + system CPU of a process and its waited-for children, in seconds."""
    fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields_[i]) for i in (11, 12, 13, 14)) / TICK


async def replicas_ready(nc: Client, count: int) -> None:
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while len(seen) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(seen)} of {count} agent replicas answered")
        try:
            pong = await rpc.call_verb(nc, bus.ping("agent"), Ping(), timeout=0.5)
            seen.add(pong.replica)
        except Exception:  # noqa: S110 - starting up: no responders yet
            pass


@dataclass
class Throughput:
    replicas: int
    turns: int
    wall_s: float
    cpu: dict[str, float]
    occupancy: dict[str, float]

    @property
    def per_second(self) -> float:
        return self.turns / self.wall_s


async def burst(root: Path, agents: int, count: int, slots: int, latency: float) -> Throughput:
    env = {"FLEET_AGENT_RUNNER": "chat", "FLEET_AGENT_TURN_SLOTS": str(slots)}
    mesh = await asyncio.to_thread(start_mesh, root / f"replicas-{agents}", env, agents, False)
    try:
        nc = await connect(mesh.server.url, name="bench-replicas")
        try:
            await replicas_ready(nc, agents)
            tenant = f"b{new_id()[:8]}"
            with ScriptedLM(lambda _: COT, latency_s=latency) as fake:
                await use_model(nc, tenant, fake)
                turns = await Turns(nc, tenant).open()
                for _ in range(2 * agents * slots):  # warm every slot of every replica
                    await asyncio.wait_for((await turns.ask("warm up"))[2], 60)
                procs = {
                    **{f"agent-{i}": r.pid for i, r in enumerate(mesh.replicas[1:])},
                    "budget": mesh.replicas[0].pid,
                    "nats-server": mesh.server.process.pid if mesh.server.process else 0,
                }
                before = {name: cpu_s(pid) for name, pid in procs.items()}
                first = time.perf_counter()
                asked = [await turns.ask("What is two plus two?") for _ in range(count)]
                ends = await asyncio.wait_for(asyncio.gather(*(a[2] for a in asked)), 300)
                wall = max(ends) - first
                after = {name: cpu_s(pid) for name, pid in procs.items()}
                occupancy = await slot_occupancy(turns, [a[0] for a in asked], slots)
        finally:
            await nc.close()
    finally:
        await asyncio.to_thread(mesh.stop)
    cpu = {name: (after[name] - before[name]) / count for name in procs}
    return Throughput(agents, count, wall, cpu, occupancy)


async def slot_occupancy(turns: Turns, sessions: list[str], slots: int) -> dict[str, float]:
    """Per replica: the time its turns ran (TurnStarted -> end) over slots x the window from
    the first start to the last end. 1.0 is every slot busy all the time."""
    busy: dict[str, float] = {}
    starts, ends = [], []
    for session in sessions:
        log = await turns.read(log_subject(turns.tenant, session))
        started = next(e for e in log if isinstance(e.data, TurnStarted))
        ended = next(e for e in log if isinstance(e.data, TurnCompleted | TurnFailed))
        replica = started.data.replica
        busy[replica] = busy.get(replica, 0.0) + (ended.ts - started.ts).total_seconds()
        starts.append(started.ts)
        ends.append(ended.ts)
    window = (max(ends) - min(starts)).total_seconds()
    return {replica: seconds / (slots * window) for replica, seconds in busy.items()}


async def replicas_part(root: Path, count: int, slots: int, latency: float) -> None:
    one = await burst(root, 1, count, slots, latency)
    two = await burst(root, 2, count, slots, latency)
    print(
        f"== turns per second, the chat agent (one {latency * 1000:.0f} ms model call per "
        f"turn), {slots} turn slots per replica, a backlog of {count} turns appended at once "
        f"(>= 2x the slots)",
        flush=True,
    )
    for result in (one, two):
        cpu = ", ".join(f"{name} {value * 1000:.1f}" for name, value in result.cpu.items())
        occupancy = ", ".join(f"{value:.2f}" for value in result.occupancy.values())
        print(f"   {result.replicas} replica(s): {result.per_second:6.2f} turns/s "
              f"({result.turns} in {result.wall_s:.2f} s); slot occupancy per replica "
              f"{occupancy}; CPU ms per turn: {cpu}")  # fmt: skip
    ideal = slots / latency
    saturated = min(one.occupancy.values()) >= 0.9
    print(f"   ratio 2/1: {two.per_second / one.per_second:.2f}x   goal: >= 1.8x "
          f"(counts only with one replica saturated: occupancy "
          f"{min(one.occupancy.values()):.2f}, {'saturated' if saturated else 'NOT saturated'}; "
          f"a replica's ceiling at this latency is {ideal:.1f} turns/s)", flush=True)  # fmt: skip


# -- part 4: the checkpoint --------------------------------------------------------------------


async def checkpoint_part(mesh: Mesh, samples: int, cell_per_iter: float) -> None:
    def measure() -> tuple[side.Stats, side.Stats]:
        with SandboxBus(mesh.server.url, tenant="bench") as sandboxes:
            ready = sandboxes.create_sandbox(labels={"session": "bench"})
            lean = sandboxes.create_sandbox(labels={"session": "bench"}, fork_ready=False)
            with_checkpoint = RemoteInterpreter(sandboxes, ready.sandbox)
            without = RemoteInterpreter(sandboxes, lean.sandbox)

            async def base() -> None:
                await asyncio.to_thread(without.execute, "x = 1")

            async def proj() -> None:
                await asyncio.to_thread(with_checkpoint.execute, "x = 1")

            pair = asyncio.run(side.side_by_side(base, proj, samples=samples, warmup=10, block=20))
            with_checkpoint.shutdown()
            without.shutdown()
            sandboxes.delete_sandbox(ready.sandbox)
            sandboxes.delete_sandbox(lean.sandbox)
            return pair

    b, p = await asyncio.to_thread(measure)
    side.report(
        "a trivial cell over the bus: fork_ready=False (no checkpoint) vs fork-ready "
        "(a checkpoint copy forked after each cell that changed state)",
        b, p, goal="note only: is the checkpoint visible in the loop's profile?", unit="cell",
    )  # fmt: skip
    cost = p.p50_ms - b.p50_ms
    share = cost / cell_per_iter if cell_per_iter > 0 else float("nan")
    print(f"   checkpoint cost per cell (p50 difference): {cost:.2f} ms; the mesh's cell "
          f"overhead per iteration at 0 ms (part 1): {cell_per_iter:.2f} ms, so the "
          f"checkpoint is {share:.0%} of it", flush=True)  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        latencies = [0.0, args.latency_ms / 1000]
        if args.compare_with is not None:
            await compare_part(root, args.compare_with, args.samples, latencies)
            return
        await trajectory_part(root, args.samples, latencies, args.cell_samples)
        if not args.skip_replicas:
            await replicas_part(root, args.turns, args.slots, args.replica_latency_ms / 1000)
        await turns_bench.main(args.turn_samples, 5, "always", False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (the smoke test)")
    parser.add_argument("--samples", type=int, default=5, help="trajectory runs per side")
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--turns", type=int, default=48, help="the backlog of part 2")
    parser.add_argument("--slots", type=int, default=2, help="turn slots per replica")
    parser.add_argument("--replica-latency-ms", type=float, default=200.0)
    parser.add_argument("--turn-samples", type=int, default=200)
    parser.add_argument("--cell-samples", type=int, default=200)
    parser.add_argument("--skip-replicas", action="store_true")
    parser.add_argument(
        "--compare-with", type=Path, default=None, metavar="TREE",
        help="only part 1, with the agent of another checkout (e.g. `git archive HEAD` "
        "unpacked) as the baseline, beside this tree's",
    )  # fmt: skip
    parsed = parser.parse_args()
    if parsed.quick:
        parsed.samples, parsed.latency_ms, parsed.turns = 1, 20.0, 8
        parsed.replica_latency_ms, parsed.turn_samples, parsed.cell_samples = 50.0, 20, 20
    asyncio.run(main(parsed))
