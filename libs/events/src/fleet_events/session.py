"""Session context: the conversation log (`fleet.session.<tenant>.<session>.log`)."""

import msgspec

from fleet_events import subjects
from fleet_events.envelope import BlobRef, Event
from fleet_events.ids import check_id
from fleet_events.llm import LLM_FAILURES


def log_subject(tenant: str, session: str) -> str:
    return subjects.SESSION_LOG.build(tenant=tenant, session=session)


def run_subject(tenant: str, session: str, run: str) -> str:
    return subjects.SESSION_RUN.build(tenant=tenant, session=session, run=run)


def session_filter(tenant: str, session: str) -> str:
    """Every subject of one session (its log and all its runs), replayed in stream order."""
    return subjects.session_scope(tenant, session)


def tenant_filter(tenant: str) -> str:
    return subjects.tenant_scope(tenant)


class SessionCreated(Event, frozen=True, kw_only=True, tag="session.created"):
    """A conversation begins; the first event of its `.log` chain."""

    title: str = ""
    owner: str = ""


class SessionRenamed(Event, frozen=True, kw_only=True, tag="session.renamed"):
    """The session's title changed."""

    title: str


class SessionDeleted(Event, frozen=True, kw_only=True, tag="session.deleted"):
    """A tombstone: the log stays; purging data is a separate admin operation."""

    reason: str = ""


class TurnRequested(Event, frozen=True, kw_only=True, tag="turn.requested"):
    """A user message arrived; the dispatcher turns it into a work item keyed by the turn id."""

    message: str
    mode: str = "auto"
    """The chat agent's execution mode: `auto`, `rlm_only` or `tools_only` (`EXECUTION_MODES`)."""
    document_ids: tuple[str, ...] = ()
    """Aliases of documents loaded into this session (`DocumentLoaded`, e.g. uploaded through
    `POST /api/v1/sessions/{id}/documents`) that the message asks about: the chat agent reads
    their text into the turn (`fleet run --context FILE`)."""
    context_paths: tuple[str, ...] = ()
    """Paths, relative to the session sandbox's working directory (a checkout uploaded through
    `POST /api/v1/sessions/{id}/checkout`), that the message asks about: named to the agent,
    which reads them with code (`fleet run --context DIR`)."""
    repo_url: str | None = None
    """A git repository the turn works in (`fleet run --repo URL`): the session's sandbox gets
    it cloned at `repo_ref` into `repo/` of its working directory (the broker's
    `CreateSandbox.repo_url`). The gateway refuses a URL that `fleet_events.git` refuses."""
    repo_ref: str | None = None
    """The branch, tag or commit id of `repo_url` to check out (None: its default branch)."""


EXECUTION_MODES = ("auto", "rlm_only", "tools_only")
"""How the chat agent may answer a turn: choose (`auto`), only through the recursive engine
(`rlm_only`), or with tools but never the RLM (`tools_only`). A plain string on the wire, so a
mode added later does not stop an older replica reading the log."""


class TurnStarted(Event, frozen=True, kw_only=True, tag="turn.started"):
    """An agent replica pulled the turn's work item (`attempt` > 1 after a redelivery)."""

    replica: str
    attempt: int = 1


class TurnCompleted(Event, frozen=True, kw_only=True, tag="turn.completed"):
    """The turn's answer; `root_head_hash` ties in the root run's chain."""

    answer: str
    root_head_hash: str = ""
    answered_by: str = ""
    """The module that gave the answer (`cot`, `react`, `rlm`; empty for a runner without
    modules, and in logs written before it existed)."""
    fallback: str = ""
    """Set when the answer is not the first module's: which module answered after which failed,
    and why, in words the user reads beside the answer ("answered by chain of thought after the
    RLM failed: …"). Empty: no fallback."""


class TurnFailed(Event, frozen=True, kw_only=True, tag="turn.failed"):
    """The turn ended in an error; `retryable` tells the client whether asking again may help."""

    error: str
    retryable: bool = False
    code: str = ""
    """Why, for programs: one of `TURN_FAILURES` (empty in logs written before it existed)."""
    attempt: int = 0
    """The attempt that ended it (0: the turn never started)."""


class TurnCancelled(Event, frozen=True, kw_only=True, tag="turn.cancelled"):
    """The user cancelled the turn; the running replica stops at its next step."""

    reason: str = ""
    partial: str = ""
    """What the turn had answered so far when it stopped (empty if it never started)."""
    attempt: int = 0


class SnapshotTaken(Event, frozen=True, kw_only=True, tag="session.snapshot_taken"):
    """A fold of this session was snapshotted up to `upto_seq` (stored in the snapshot KV)."""

    fold: str
    fold_version: int
    upto_seq: int


# -- the turn lifecycle: admission, cancel, attempts, the work item (issue 9, turns) ---------
# One turn runs per session at a time, decided by the order of the `.log`: a `TurnRequested`
# that lands while an earlier admitted turn has not ended is refused (`fleet_agent.turns`). The
# rule reads only the log, so every dispatcher replica, and every redelivery, decides the same.

TURN_REFUSALS = ("busy", "session_deleted", "malformed")
"""Why a turn was refused: another turn of the session is running; the session is deleted;
the request cannot be run as stored (its turn id is missing or not a subject-safe token)."""

TURN_FAILURES = (
    "runner_error",
    "replica_lost",
    "poison",
    "sandbox_lost",
    "llm_not_configured",
    *LLM_FAILURES,
    "repo_unavailable",
    "budget_spent",
    "no_submit",
    "not_computed",
)
"""Every `TurnFailed.code` the agent writes (a client switches on them; a test holds the agent's
codes to this list). `runner_error`: the agent raised; `replica_lost`: the replica running it
stopped and the runner cannot resume; `poison`: its work item was delivered `max_attempts`
times, never ending; `sandbox_lost`: the run's sandbox went away and a later attempt found it
gone; `llm_not_configured`: no model is bound to the role the turn needs; `llm_*`: a model
call failed, by kind (docs/turns.md, "When the model call fails"); `repo_unavailable`: the
broker could not clone the turn's repository at its ref; `budget_spent`: the budget refused a
model call the turn could not do without (a tenant's daily cap, the tree's limits);
`no_submit`: the RLM used all its iterations without calling `SUBMIT`, so it has no answer
(dspy's extract step would only guess one: it is not asked); `not_computed`: the question is
one code computes (the stated rule, `run.compute_decided`) and the cells the model wrote did
not compute it (no other module's guess is given in its place)."""


class TurnRefused(Event, frozen=True, kw_only=True, tag="turn.refused"):
    """A well-formed request the session declined (`reason` in `TURN_REFUSALS`); never run."""

    reason: str
    message: str
    active_turn: str = ""
    """The turn that was running when a `busy` request arrived."""


class CancelRequested(Event, frozen=True, kw_only=True, tag="turn.cancel_requested"):
    """Stop the envelope's turn: the running replica stops at its next step boundary and
    records `TurnCancelled` with the partial answer; a turn not yet started never starts."""

    reason: str = ""


class TurnParked(Event, frozen=True, kw_only=True, tag="turn.parked"):
    """The turn waits for the user's answer to input request `request_id`, holding no worker:
    its work item was acked. The answer (`input.provided`), its expiry or a cancel on the log
    is dispatched as a resume work item (`turn_resume_id`), and attempt + 1 carries on from
    the run's record."""

    request_id: str
    attempt: int = 0


TURN_EVENTS: tuple[type[Event], ...] = (TurnRefused, CancelRequested, TurnParked)


class TurnWork(msgspec.Struct, frozen=True, kw_only=True):
    """The work item on `fleet.work.agent.turn`: which turn to run. Everything else (the
    message, cancels, attempts) is read from the session's log, the one source of truth."""

    tenant: str
    session: str
    turn: str
    requested_seq: int
    """Stream sequence of the `TurnRequested` (its message is read from there)."""


TURN_WORK_SUBJECT = subjects.work("agent", "turn")


def turn_work_id(tenant: str, session: str, turn: str) -> str:
    """The work item's `Nats-Msg-Id`: unique per tenant and session as well as turn, so a turn
    id chosen (or reused) elsewhere can never deduplicate away another session's turn."""
    return (
        f"turn.{check_id('tenant', tenant)}.{check_id('session', session)}.{check_id('turn', turn)}"
    )


def turn_resume_id(tenant: str, session: str, turn: str, request_id: str) -> str:
    """The `Nats-Msg-Id` of the work item that resumes a turn parked on `request_id`."""
    return f"{turn_work_id(tenant, session, turn)}.resume.{check_id('request', request_id)}"


# -- the session's state: memory, documents, interpreter, input, import / restore ------------
# (issue 9; the turn lifecycle above is another block.) These are the facts the agent's
# session fold (`fleet_events.session_fold`) is built from. Each carries the state it leaves
# behind (a block's whole new text, a document's whole reference) rather than a diff, so the
# fold never depends on what came before to read one event right.

CORE_MEMORY_LIMITS: dict[str, int] = {"persona": 2000, "human": 2000, "scratchpad": 1000}
"""Characters each core-memory block may hold; a change past its limit is refused."""

DOCUMENT_SOURCES = ("upload", "sandbox_path", "url")
"""Where a loaded document came from (its text is in the object store either way)."""


class CoreMemory(msgspec.Struct, frozen=True, kw_only=True):
    """The blocks every turn's prompt carries, within `CORE_MEMORY_LIMITS`."""

    persona: str = ""
    human: str = ""
    scratchpad: str = ""


class HistoryTurn(msgspec.Struct, frozen=True, kw_only=True):
    """One finished exchange, in the shape of a `dspy.History` message."""

    question: str
    answer: str
    turn: str = ""


class DocumentRef(msgspec.Struct, frozen=True, kw_only=True):
    """A loaded document: its text lives in the object store, the session holds the reference."""

    alias: str
    source: str
    origin: str
    blob: BlobRef
    chars: int = 0
    media_type: str = "text/plain"
    title: str = ""


class InterpreterState(msgspec.Struct, frozen=True, kw_only=True):
    """What a replacement sandbox needs to be made like the session's own (REPL memory aside).

    `sandbox` is None once the sandbox is gone; the rest stays so the next one gets the same
    repo, ref, context paths, volume and subpath.
    """

    sandbox: str | None
    workspace: str = ""
    """Empty: the workspace's host path is the broker's and never recorded here (the session's
    record is exported and shown to its tenant); records from before issue 27 may hold one."""
    repo_url: str | None = None
    ref: str | None = None
    context_paths: tuple[str, ...] = ()
    volume: str | None = None
    volume_subpath: str | None = None


class MemoryFile(msgspec.Struct, frozen=True, kw_only=True):
    """A file the agent wrote under the session volume's memory directory."""

    path: str
    sha256: str
    size: int


class SessionImage(msgspec.Struct, frozen=True, kw_only=True):
    """A whole session state, carried by import and restore so that they replace, never merge.

    `documents` are in access order, least recent first. The empty image is the empty session.
    """

    turns: tuple[HistoryTurn, ...] = ()
    core_memory: CoreMemory = CoreMemory()
    documents: tuple[DocumentRef, ...] = ()
    active_document: str | None = None
    interpreter: InterpreterState | None = None
    memory_files: tuple[MemoryFile, ...] = ()


class CoreMemoryChanged(Event, frozen=True, kw_only=True, tag="memory.core_changed"):
    """A core-memory block changed (`op` append or replace); `value` is its whole new text."""

    block: str
    op: str
    value: str
    text: str = ""
    old: str = ""


class CoreMemoryRefused(Event, frozen=True, kw_only=True, tag="memory.core_refused"):
    """A core-memory change declined (over the limit, text not found, ...), and why.

    The model reads `message` as the tool's answer and can shorten or rephrase its change.
    """

    block: str
    op: str
    reason: str
    message: str
    limit: int = 0
    length: int = 0


class MemoryFileWritten(Event, frozen=True, kw_only=True, tag="memory.file_written"):
    """The agent wrote a memory file on the session volume (the bytes are on the volume)."""

    file: MemoryFile


class DocumentLoaded(Event, frozen=True, kw_only=True, tag="document.loaded"):
    """A document was loaded (from an upload, a sandbox path or a URL) and is now active."""

    document: DocumentRef


class DocumentActivated(Event, frozen=True, kw_only=True, tag="document.activated"):
    """The document later questions are about by default changed."""

    alias: str


class DocumentRemoved(Event, frozen=True, kw_only=True, tag="document.removed"):
    """A document left the session (its blob stays until purged)."""

    alias: str
    reason: str = ""


class SandboxAttached(Event, frozen=True, kw_only=True, tag="session.sandbox_attached"):
    """The session's interpreter runs in this sandbox now (new, or replacing `replaces`).

    Sandbox lifecycle lives on the SANDBOXES stream, outside a session's replay; this is the
    session's own record of which sandbox, workspace, repo and volume it uses.
    """

    interpreter: InterpreterState
    replaces: str = ""
    reason: str = ""


class SandboxDetached(Event, frozen=True, kw_only=True, tag="session.sandbox_detached"):
    """The session's sandbox is gone; its volume and checkout settings are kept for the next."""

    sandbox: str
    reason: str = ""


class InputRequested(Event, frozen=True, kw_only=True, tag="input.requested"):
    """The agent asked the user a question; the turn parks until an answer or `timeout_s`."""

    request_id: str
    question: str
    options: tuple[str, ...] = ()
    timeout_s: float = 0.0


class InputProvided(Event, frozen=True, kw_only=True, tag="input.provided"):
    """The user answered the pending request `request_id` (free text or one of its options)."""

    request_id: str
    answer: str
    option: str = ""


class InputExpired(Event, frozen=True, kw_only=True, tag="input.expired"):
    """Nobody answered request `request_id` in time; the turn goes on without the answer."""

    request_id: str
    reason: str = ""


class InputRefused(Event, frozen=True, kw_only=True, tag="input.refused"):
    """An answer that fits no pending request (already answered, expired, another id)."""

    request_id: str
    reason: str
    message: str


class SessionImported(Event, frozen=True, kw_only=True, tag="session.imported"):
    """The session's state was replaced by an export's: a new chain starts from here.

    `source_head_hash` is the head of the exported `.log`, so the export it came from is named
    and stays verifiable on its own.
    """

    image: SessionImage
    source_session: str = ""
    source_head_hash: str = ""


class SessionRestored(Event, frozen=True, kw_only=True, tag="session.restored"):
    """The session's state was set back to what it was at `upto_seq` (the empty image resets)."""

    image: SessionImage
    upto_seq: int = 0
    reason: str = ""


STATE_EVENTS: tuple[type[Event], ...] = (
    CoreMemoryChanged,
    CoreMemoryRefused,
    MemoryFileWritten,
    DocumentLoaded,
    DocumentActivated,
    DocumentRemoved,
    SandboxAttached,
    SandboxDetached,
    InputRequested,
    InputProvided,
    InputExpired,
    InputRefused,
    SessionImported,
    SessionRestored,
)


class TraceFeedbackRecorded(Event, frozen=True, kw_only=True, tag="trace.feedback_recorded"):
    """A person's judgement of a turn's answer (`POST /api/v1/traces/feedback`), on the
    session's log beside the turn it judges (the envelope's `turn`): what an evaluation or an
    optimizer later reads as a label. `trace_id` is the turn's OTLP trace id."""

    trace_id: str
    is_correct: bool | None = None
    comment: str = ""
    expected_response: str = ""
    user: str = ""


class SessionPurged(Event, frozen=True, kw_only=True, tag="session.purged"):
    """A deleted session's events were removed by an admin (`POST /api/v1/sessions/{id}/purge`):
    `purged` names each subject's last sequence and hash as the checkpointer's signed receipt
    `receipt` (digest `receipt_digest`) pinned them before purging. Stored on the session's
    `.run.purge` subject, so its `.log` stays empty (the session is gone: 404); read models
    drop the session's rows."""

    receipt: int
    receipt_digest: str
    purged: dict[str, tuple[int, str]]
    by: str
    reason: str = ""


# -- the checkpointer's purge verb (`fleet_events.bus.PURGE_SESSION`) --------------------------


class PurgeSession(msgspec.Struct, frozen=True, kw_only=True):
    """Purge every subject of a tombstoned session behind a signed receipt (the checkpointer
    refuses a session whose log does not end with `session.deleted`)."""

    request_id: str
    tenant: str
    session: str
    by: str
    reason: str = ""


class PurgeReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """The signed checkpoint that accounts for what was purged: its number and digest, the
    subjects it names with their last sequence and hash, and the checkpoint key's id."""

    receipt: int
    digest: str
    purged: dict[str, tuple[int, str]]
    key: str


EVENTS: tuple[type[Event], ...] = (
    SessionCreated,
    SessionRenamed,
    SessionDeleted,
    TurnRequested,
    TurnStarted,
    TurnCompleted,
    TurnFailed,
    TurnCancelled,
    *TURN_EVENTS,
    SnapshotTaken,
    *STATE_EVENTS,
    TraceFeedbackRecorded,
    SessionPurged,
)
