"""The bus catalog: every request/reply verb and every other subject, typed, in one place.

A verb names its service, its request and reply types and its scope, so the serving side
(`fleet_mesh.rpc.serve_verb`, `ServiceContext.serve`) and the calling side
(`fleet_mesh.rpc.call_verb`) are written against the same object and cannot drift: no verb is
spelled as a string anywhere else. The subject and verb tables of docs/architecture.md and the
AsyncAPI document (`fleet_events.asyncapi`) are generated from here; a test fails when the doc
is stale.

Scopes:
- `service`: `fleet.rpc.<service>.<verb>`, served in the service's queue group (any replica);
- `sandbox`: `fleet.rpc.sandbox-broker.sandbox.<sandbox>.<verb>`, served by the one broker
  replica holding that sandbox's processes (no queue group: "no responders" means it is gone);
- `interpreter`: `fleet.callback.<interpreter>`, served by the one interpreter that owns the
  REPL context whose code called a host tool.
"""

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec

from fleet_events import budget, llm, quality, run, session, subjects
from fleet_events import sandbox as sb
from fleet_events.envelope import Event

Req = TypeVar("Req")
Rep = TypeVar("Rep")

Scope = Literal["service", "sandbox", "interpreter"]


class Ping(msgspec.Struct, frozen=True, kw_only=True):
    """Every service answers it once every subscription of its setup is live."""


class Pong(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    replica: str
    pid: int
    uptime_s: float
    details: dict[str, Any] = {}


@dataclass(frozen=True, eq=False)
class Verb(Generic[Req, Rep]):
    service: str
    name: str
    request: type[Req]
    reply: type[Rep]
    scope: Scope
    summary: str

    def subject(self, target: str | None = None) -> str:
        """The subject to call or serve; `target` is the sandbox or interpreter id of a
        per-sandbox or per-interpreter verb, and must be absent for a queue-group verb."""
        if self.scope == "service":
            if target is not None:
                raise ValueError(f"{self.key} is a queue-group verb: it takes no target")
            return subjects.rpc(self.service, self.name)
        if target is None:
            raise ValueError(f"{self.key} is a per-{self.scope} verb: give the {self.scope} id")
        if self.scope == "sandbox":
            return subjects.SANDBOX_RPC.build(service=self.service, sandbox=target, verb=self.name)
        return subjects.callback(target)

    @property
    def key(self) -> str:
        return f"{self.service}.{self.name}"

    @property
    def pattern(self) -> str:
        """The subject with its parameter spelled as `{sandbox}` / `{interpreter}`."""
        if self.scope == "service":
            return self.subject()
        if self.scope == "sandbox":
            return subjects.SANDBOX_RPC.filter(service=self.service, verb=self.name).replace(
                "*", "{sandbox}"
            )
        return subjects.CALLBACK.text

    def queue(self) -> str:
        """The queue group its servers join ("" for a verb with exactly one server)."""
        return self.service if self.scope == "service" else ""


def _broker(name: str, request: type[Req], reply: type[Rep], summary: str) -> Verb[Req, Rep]:
    return Verb(sb.BROKER, name, request, reply, "service", summary)


def _sandbox(name: str, request: type[Req], reply: type[Rep], summary: str) -> Verb[Req, Rep]:
    return Verb(sb.BROKER, name, request, reply, "sandbox", summary)


def _budget(name: str, request: type[Req], reply: type[Rep], summary: str) -> Verb[Req, Rep]:
    return Verb("budget", name, request, reply, "service", summary)


# -- every service ---------------------------------------------------------------------------

PING: dict[str, Verb[Ping, Pong]] = {
    name: Verb(name, "ping", Ping, Pong, "service", "liveness; answered once setup is done")
    for name in subjects.SERVICES
}


def ping(service: str) -> Verb[Ping, Pong]:
    try:
        return PING[service]
    except KeyError:
        raise ValueError(
            f"unknown service {service!r}: expected one of {', '.join(subjects.SERVICES)}"
        ) from None


# -- sandbox broker: queue group -------------------------------------------------------------

CREATE_SANDBOX = _broker(
    "create", sb.CreateSandbox, sb.SandboxInfo, "start a sandbox (repo, volume, context files)"
)
LIST_SANDBOXES = _broker(
    "list", sb.ListSandboxes, sb.SandboxList, "one page of the tenant's sandboxes"
)
RESUME_SANDBOX = _broker(
    "resume", sb.ResumeSandbox, sb.SandboxInfo,
    "the session's sandbox, or a replacement on the same volume if it is gone",
)  # fmt: skip
LIST_VOLUME = _broker("volume_list", sb.ListVolume, sb.VolumeListing, "browse a durable volume")
READ_VOLUME_FILE = _broker(
    "volume_read", sb.ReadVolumeFile, sb.FileContent, "read a file of a durable volume"
)

# -- sandbox broker: the replica holding one sandbox ----------------------------------------

FORK_SANDBOX = _sandbox("fork", sb.ForkSandbox, sb.SandboxInfo, "fork files and REPL memory")
BUILD_CHILD = _sandbox(
    "build_child", sb.BuildChild, sb.ChildSandbox,
    "a child sandbox for a recursive run, under the isolation policy",
)  # fmt: skip
OPEN_CONTEXT = _sandbox("open", sb.OpenContext, sb.Ack, "open a named REPL context")
CLOSE_CONTEXT = _sandbox("close", sb.CloseContext, sb.Ack, "close a REPL context")
EXECUTE = _sandbox("exec", sb.Execute, sb.ExecuteReply, "run one cell in a context")
INTERRUPT_CELL = _sandbox(
    "interrupt", sb.InterruptCell, sb.Interrupted, "stop the running cell; the sandbox survives"
)
PUT_FILE = _sandbox("put", sb.PutFile, sb.FileInfo, "write a workspace file")
GET_FILE = _sandbox("read", sb.GetFile, sb.FileContent, "read a workspace file")
GET_SANDBOX = _sandbox("info", sb.GetSandbox, sb.SandboxInfo, "the sandbox's current state")
DELETE_SANDBOX = _sandbox("delete", sb.DeleteSandbox, sb.Ack, "stop it and remove its files")

# -- budget ------------------------------------------------------------------------------------

OPEN_TREE = _budget("open", budget.OpenTree, budget.OpenReply, "open a turn's budget tree")
GRANT = _budget("grant", budget.Grant, budget.GrantReply, "reserve LLM calls and tokens")
RECORD_USAGE = _budget(
    "usage", budget.RecordUsage, budget.UsageReply, "record what a granted call used"
)
ADMIT_CHILD = _budget("admit", budget.AdmitChild, budget.AdmitReply, "admit a child run")
CLOSE_TREE = _budget("close", budget.CloseTree, budget.TreeStatus, "close a tree")
TREE_STATUS = _budget("status", budget.GetStatus, budget.TreeStatus, "a tree's spend and caps")

# -- callbacks ---------------------------------------------------------------------------------

TOOL_CALL: Verb[sb.ToolCall, sb.ToolReply] = Verb(
    "agent", "tool", sb.ToolCall, sb.ToolReply, "interpreter",
    "a host tool called by sandbox code, relayed by the broker to the owning interpreter",
)  # fmt: skip

VERBS: tuple[Verb[Any, Any], ...] = (
    *PING.values(),
    CREATE_SANDBOX,
    LIST_SANDBOXES,
    RESUME_SANDBOX,
    LIST_VOLUME,
    READ_VOLUME_FILE,
    FORK_SANDBOX,
    BUILD_CHILD,
    OPEN_CONTEXT,
    CLOSE_CONTEXT,
    EXECUTE,
    INTERRUPT_CELL,
    PUT_FILE,
    GET_FILE,
    GET_SANDBOX,
    DELETE_SANDBOX,
    OPEN_TREE,
    GRANT,
    RECORD_USAGE,
    ADMIT_CHILD,
    CLOSE_TREE,
    TREE_STATUS,
    TOOL_CALL,
)


def verbs_of(service: str, scope: Scope | None = None) -> tuple[Verb[Any, Any], ...]:
    return tuple(v for v in VERBS if v.service == service and (scope is None or v.scope == scope))


# -- the other subjects: event streams, work queues, live deltas ------------------------------

Kind = Literal["events", "work", "live"]


@dataclass(frozen=True)
class Channel:
    """A subject pattern that is not a verb. `events`: what may be appended there (wrapped
    in the `Envelope`); `stream`: the JetStream stream that captures it (None: core NATS)."""

    name: str
    pattern: str
    kind: Kind
    stream: str | None
    summary: str
    events: tuple[type[Event], ...] = ()
    payload: type[Any] | None = None

    def parse(self, subject: str) -> dict[str, str] | None:
        """The parameters of `subject` by name when it is one of this channel's, else None."""
        return subjects.Pattern(self.pattern).parse(subject)


CELL_OUTPUT_PATTERN = subjects.CELL_OUTPUT.text


def cell_output_subject(interpreter: str) -> str:
    """Where the broker sends what a running cell of `interpreter`'s contexts prints."""
    return subjects.CELL_OUTPUT.build(interpreter=interpreter)


class LiveDelta(msgspec.Struct, frozen=True, kw_only=True):
    """An unpersisted delta (a streamed token, a stdout chunk); the persisted event follows."""

    kind: str
    run: str | None = None
    text: str = ""


CALL_STARTED_DELTA = "llm_call_started"
"""A `LiveDelta` kind: a granted model call about to be sent, its text
`{"grant": …, "role": …, "model": …}` as JSON; the stored `run.llm_called` with that
`grant_id` ends it (a watcher shows the call in flight meanwhile)."""

MODEL_WAITING_DELTA = "model_waiting"
"""A `LiveDelta` kind: a model call waits for the embedded model to come up; its text says what
the model is doing and about how long it still needs (`waiting for the local model: building:
…, ~12 min left`). The call's `llm_call_started`, or the run's end, ends the wait."""


CHANNELS: tuple[Channel, ...] = (
    Channel(
        "session-log", subjects.SESSION_LOG.text, "events", "SESSIONS",
        "session-level events: created, turns requested and ended, memory, documents",
        events=session.EVENTS,
    ),
    Channel(
        "session-run", subjects.SESSION_RUN.text, "events", "SESSIONS",
        "one run's steps, written only by the replica executing that run",
        events=run.EVENTS,
    ),
    Channel(
        "sandbox", subjects.SANDBOX.text, "events", "SANDBOXES",
        "a sandbox's lifecycle", events=sb.EVENTS,
    ),
    Channel(
        "budget-tree", subjects.BUDGET_TREE.text, "events", "BUDGET",
        "one recursive tree's ledger", events=budget.EVENTS,
    ),
    Channel(
        "budget-tenant-day", subjects.BUDGET_TENANT_DAY.text, "events", "BUDGET",
        "a tenant's daily ledger (charges and releases)", events=budget.EVENTS,
    ),
    Channel(
        "quality", subjects.QUALITY.text, "events", "QUALITY",
        "datasets, evaluation runs, promotions", events=quality.EVENTS,
    ),
    Channel(
        "work", subjects.WORK.text, "work", "WORK",
        "work items (turns, child runs, optimization runs), pulled by any replica and acked "
        "when done",
    ),
    Channel(
        "agent-turn", session.TURN_WORK_SUBJECT, "work", "WORK",
        "one turn to run, published by the agent's dispatcher (`Nats-Msg-Id` names tenant, "
        "session and turn); acked once the turn's end is stored",
        payload=session.TurnWork,
    ),
    Channel(
        "agent-child-run", run.CHILD_RUN_WORK_SUBJECT, "work", "WORK",
        "one child run of a recursive tree (`sub_rlm`), published by its parent after the child "
        "sandbox is built (`Nats-Msg-Id` is the child run id); acked once the run's end is stored",
        payload=run.ChildRunWork,
    ),
    Channel(
        "live", subjects.LIVE.text, "live", None,
        "unpersisted deltas for watchers; everything that matters is also an event. Kinds: "
        "`assistant_token` (the answer streaming), `cell_output` (a running cell's prints), "
        "`llm_call_started` (a granted call sent: in flight until the `run.llm_called` with its "
        "`grant_id`), `model_waiting` (a call waits for the embedded model to come up: what it "
        "does, about how long)",
        payload=LiveDelta,
    ),
    Channel(
        "cell-output", CELL_OUTPUT_PATTERN, "live", None,
        "what a running cell prints, from the broker holding its sandbox to the interpreter "
        "owning its context, at most every 100 ms (the agent relays it as `cell_output` live "
        "deltas); the cell's reply carries all of it",
        payload=sb.CellOutput,
    ),
)  # fmt: skip


def channel_of(subject: str) -> tuple[Channel, dict[str, str]] | None:
    """The catalog's channel a concrete subject belongs to, with its parameters (the most
    specific one: `fleet.work.agent.turn` is `agent-turn`, not the generic `work`)."""
    found = [(c, p) for c in CHANNELS if (p := c.parse(subject)) is not None]
    if not found:
        return None
    return min(found, key=lambda pair: len(pair[1]))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def verb_markdown() -> str:
    """The verb table of docs/architecture.md (a test keeps the doc in step)."""
    rows = [
        "| service | verb | scope | subject | request → reply | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for v in VERBS:
        if v.name == "ping" and v.service != subjects.SERVICES[0]:
            continue
        service = "every service" if v.name == "ping" else v.service
        subject = subjects.RPC.text.replace("{verb}", "ping") if v.name == "ping" else v.pattern
        types = f"`{v.request.__name__}` → `{v.reply.__name__}`"
        rows.append(
            f"| {service} | `{v.name}` | {v.scope} | `{subject}` | {types} | {_cell(v.summary)} |"
        )
    return "\n".join(rows)


def broker_markdown() -> str:
    """The bus API table of docs/sandboxes.md: every verb the broker serves, who serves it,
    and the two subjects it uses towards an interpreter."""
    served_by = {
        "service": "queue group (any replica)",
        "sandbox": "only the replica holding `{sandbox}`",
        "interpreter": "the interpreter owning the context",
    }
    rows = ["| subject | served by | request → reply | meaning |", "|---|---|---|---|"]
    for v in (*verbs_of(sb.BROKER, "service"), *verbs_of(sb.BROKER, "sandbox"), TOOL_CALL):
        types = f"`{v.request.__name__}` → `{v.reply.__name__}`"
        rows.append(f"| `{v.pattern}` | {served_by[v.scope]} | {types} | {_cell(v.summary)} |")
    output = next(c for c in CHANNELS if c.pattern == CELL_OUTPUT_PATTERN)
    assert output.payload is not None
    rows.append(
        f"| `{output.pattern}` | {served_by['interpreter']} | `{output.payload.__name__}` "
        f"(no reply) | {_cell(output.summary)} |"
    )
    return "\n".join(rows)


def channel_markdown() -> str:
    """The subject table of docs/architecture.md, beside the verb table."""
    rows = ["| subject | kind | stream | carries | meaning |", "|---|---|---|---|---|"]
    for c in CHANNELS:
        if c.events:
            carries = ", ".join(f"`{e.__struct_config__.tag}`" for e in c.events)
        elif c.payload is not None:
            carries = f"`{c.payload.__name__}`"
        elif c.kind == "events":
            carries = "(no event types yet)"
        else:
            carries = "work items"
        stream = c.stream or "core NATS"
        rows.append(f"| `{c.pattern}` | {c.kind} | {stream} | {carries} | {_cell(c.summary)} |")
    return "\n".join(rows)


# -- agent: LLM roles and the model probe ------------------------------------------------------
# (after the catalog above so the section lands without touching its lines; VERBS is extended)

AGENT_STATUS: Verb[llm.GetAgentStatus, llm.AgentStatus] = Verb(
    "agent", "status", llm.GetAgentStatus, llm.AgentStatus, "service",
    "the tenant's LLM roles: the profile and model each uses, and what is missing",
)  # fmt: skip
TEST_LM: Verb[llm.TestLm, llm.TestLmResult] = Verb(
    "agent", "test_lm", llm.TestLm, llm.TestLmResult, "service",
    "probe a role's model: preflight checks, then 'Reply with exactly OK'",
)  # fmt: skip

VERBS = (*VERBS, AGENT_STATUS, TEST_LM)

# -- sandbox broker: the Daytona probe ---------------------------------------------------------

TEST_DAYTONA = _broker(
    "test_daytona", sb.TestDaytona, sb.DaytonaProbe,
    "probe the Daytona provider: configuration, its circuit, one live call",
)  # fmt: skip

VERBS = (*VERBS, TEST_DAYTONA)

# -- sandbox broker: archive (the holding replica) ---------------------------------------------

ARCHIVE_SANDBOX = _sandbox(
    "archive", sb.ArchiveSandbox, sb.SandboxInfo,
    "archive it with its provider (files kept, nothing running); refused where it cannot",
)  # fmt: skip

VERBS = (*VERBS, ARCHIVE_SANDBOX)

# -- the checkpointer (a role of `fleet up`'s process, holding the checkpoint key) -------------

PURGE_SESSION: Verb[session.PurgeSession, session.PurgeReceipt] = Verb(
    "checkpointer", "purge", session.PurgeSession, session.PurgeReceipt, "service",
    "purge a tombstoned session's subjects behind a signed receipt (an admin's, via the gateway)",
)  # fmt: skip

VERBS = (*VERBS, PURGE_SESSION)
