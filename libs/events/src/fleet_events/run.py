"""Run context: the steps of one run (`fleet.session.<tenant>.<session>.run.<run>`).

Each run has its own subject, written only by the replica executing it, so every run is its
own hash chain. The events are the run's record, not just its trace: every model response,
cell result and tool result is stored with an id that links it to the request that caused it,
so a killed run can be resumed from its record without paying for its model calls again, and
the CLI can replay a run offline against the recorded answers (docs/agent.md, "Replay").

Fields that name a choice (`request_kind`, escalation rules, module names) are plain strings
with the allowed values listed beside them, not `Literal`s: a replica one version behind must
still decode a value added later, and a `Literal` would refuse the whole envelope.
"""

import hashlib
from typing import Any

import msgspec

from fleet_events import subjects
from fleet_events.envelope import BlobRef, Event

# -- values named by the events below -------------------------------------------------------

MODULES = ("cot", "code", "react", "rlm")
"""The chat agent's modules, cheapest first: escalation goes up this list, fallback down it
(`code` is one sandbox cell for a computable question: docs/chat.md)."""

ESCALATION_RULES = ("tools_needed", "context_over_threshold", "rlm_only", "forced", "computable")
"""Why a turn moved up a module: the module asked for tools (`[TOOLS NEEDED]`), the context
passed the threshold (32,000 characters by default), the execution mode is `rlm_only`, the
request forced it, or the question is one code computes (arithmetic, dates, a count or sum
over attached context)."""

REQUEST_KINDS = ("step", "sub")
"""`step`: a run's own action or extract call, bounded by `max_iters`; `sub`: every other call
(`llm_query`, facade sub-agents), counted against the tree's `max_llm_calls`."""

CELL_OUTCOMES = ("result", "final", "syntax", "error", "terminal")
"""How a cell ended: a value (or none), `SUBMIT`, code that did not parse, an error the model can
fix, or the sandbox stopping under it."""

TOOL_SOURCES = ("react", "sandbox")
"""Who called a tool: the chat agent's ReAct loop, or sandbox code through a host callback."""


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of an LM request as sent, so a replay can match and show the exact prompt."""

    role: str
    content: str | list[Any] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[Any] | None = None


def request_digest(model: str, messages: list[ChatMessage], params: dict[str, Any]) -> str:
    """The sha256 of an LM request's canonical form: replay finds a recorded response by it.

    Keys are sorted and the encoding is msgspec's canonical JSON, so two replicas (or the CLI
    offline) compute the same digest for the same request.
    """
    body = msgspec.json.encode(
        {"model": model, "messages": messages, "params": params}, order="sorted"
    )
    return hashlib.sha256(body).hexdigest()


# -- the run's life ---------------------------------------------------------------------------


class RunStarted(Event, frozen=True, kw_only=True, tag="run.started"):
    """A run (chat agent or RLM, root or child) began within a budget tree.

    `inputs` are what the run's module was called with, so an offline replay can call it the
    same way; `parent_call` is the parent's tool call that asked for this child run.
    """

    kind: str
    tree: str
    depth: int = 0
    task: str = ""
    mode: str = ""
    signature: str = ""
    inputs: dict[str, Any] = {}
    max_iters: int = 0
    max_llm_calls: int = 0
    sandbox: str = ""
    parent_call: str = ""


class IterationPlanned(Event, frozen=True, kw_only=True, tag="run.iteration_planned"):
    """The model's reasoning and code (RLM) or next tool (ReAct) for iteration `index`.

    `llm_call` names the `LlmCalled` whose response this was parsed from, so a trace shows which
    prompt produced which step; the cell it ran as points back here by `iteration`.
    """

    index: int
    reasoning: str = ""
    code: str = ""
    tool: str = ""
    llm_call: str = ""


class CellExecuted(Event, frozen=True, kw_only=True, tag="run.cell_executed"):
    """One code cell ran in the run's sandbox context, with everything the RLM was told.

    `final` is what the cell `SUBMIT`ted (None when it did not). A resumed or replayed run
    hands the recorded result back for `cell_id` instead of running the cell again. When
    stdout was cut for the inline record, `stdout_blob` holds all of it. `outcome` is how the
    cell ended (`CELL_OUTCOMES`; empty in records older than it, read from `error` and
    `final` then) and `value` the value of its last expression, so a resume hands dspy back
    exactly what the sandbox answered.
    """

    code: str
    stdout: str = ""
    error: str = ""
    duration_ms: float = 0.0
    cell_id: str = ""
    iteration: int | None = None
    final: dict[str, Any] | None = None
    sandbox: str = ""
    context: str = ""
    stdout_blob: BlobRef | None = None
    outcome: str = ""
    value: Any = None
    setup: bool = False
    """The framework's own set-up code (dspy's sandbox facade, run before the first
    iteration), not a cell the model wrote: kept for replay, not shown as the model's."""


class LlmCalled(Event, frozen=True, kw_only=True, tag="run.llm_called"):
    """One LM call of the run: who asked, what was sent, what came back, and what it cost.

    `call_id` is fixed by the call's position in the run (`index`), and the budget grant is
    asked under `grant_id`, so a resumed run re-asks the same grant (a retry never grants
    twice) and finds this response by `request_hash`. `messages` and `response` are inline,
    or a `BlobRef` when large: the token and cost fields stay readable to projections that never
    fetch the prompt. `cached`: served by the LM cache (no provider call); `recorded`: served
    from this run's record on resume or replay (no provider call, no grant).
    """

    role: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    call_id: str = ""
    index: int = 0
    request_kind: str = "sub"
    grant_id: str = ""
    messages: list[ChatMessage] | BlobRef = []
    params: dict[str, Any] = {}
    response: str | BlobRef = ""
    request_hash: str = ""
    error: str = ""
    error_code: str = ""
    """What kind of failure `error` is, for programs (`llm_rate_limited`, `llm_auth_failed`,
    ...; `fleet_agent.llm_failures`); empty for a call that answered."""
    retry_in_s: float = 0.0
    """A failed call the LM asked again after this wait (a rate limit's `Retry-After`): the
    retry is the next `run.llm_called` with the same `request_hash`."""
    http_status: int = 0
    """A failed call's HTTP status (0: none came back); with `retry_after_s`, what a resumed
    or replayed run needs to fail the call with the same words the live run saw."""
    retry_after_s: float | None = None
    """The provider's `Retry-After` on a failed call, if it sent one."""
    error_shown: str = ""
    """A failed call's error as its caller saw it (the exception's text: what a cell's
    `llm_query` raised with, `[ERROR] …` in a batch); `fleet replay` answers with it."""
    cell: str = ""
    cached: bool = False
    recorded: bool = False


class ToolCalled(Event, frozen=True, kw_only=True, tag="run.tool_called"):
    """A tool was called (by ReAct or by sandbox code); its result carries the same `call_id`."""

    call_id: str
    tool: str
    args: dict[str, Any] = {}
    source: str = "react"
    cell: str = ""


class ToolReturned(Event, frozen=True, kw_only=True, tag="run.tool_returned"):
    """What tool call `call_id` gave back (or its error), recorded so a resume need not redo it."""

    call_id: str
    tool: str
    result: Any = None
    error: str = ""
    duration_ms: float = 0.0


class Escalated(Event, frozen=True, kw_only=True, tag="run.escalated"):
    """The chat agent moved up a module (`MODULES`) because `rule` (`ESCALATION_RULES`) fired."""

    from_module: str
    to_module: str
    rule: str
    detail: str = ""


class ComputeDecided(Event, frozen=True, kw_only=True, tag="run.compute_decided"):
    """Is the turn's question one code computes? The stated rule's answer, recorded for every
    turn that may take the code route (`auto`, `tools_only`), so a question left to chain of
    thought says why as surely as one sent to the sandbox."""

    computable: bool
    rule: str
    """`arithmetic`, `dates`, `count_over_context`, or `none`."""
    detail: str = ""


class FellBack(Event, frozen=True, kw_only=True, tag="run.fell_back"):
    """A module's step failed and the turn went on with a cheaper module, for `reason`."""

    from_module: str
    to_module: str
    reason: str
    error: str = ""
    note: str = ""
    """The line the answer carries if this module answers (`TurnCompleted.fallback`)."""


class ChildRunRequested(Event, frozen=True, kw_only=True, tag="run.child_requested"):
    """`sub_rlm` asked for a child run; `call_id` is the tool call that waits for it."""

    child_run: str
    task: str
    call_id: str = ""
    batch_index: int = 0
    depth: int = 0


class ChildRunCompleted(Event, frozen=True, kw_only=True, tag="run.child_completed"):
    """A child run's answer, with the head hash of the child's chain."""

    child_run: str
    answer: str
    child_head_hash: str
    call_id: str = ""


class ChildRunFailed(Event, frozen=True, kw_only=True, tag="run.child_failed"):
    """A child run ended without an answer; the parent's tool call gets `error` instead.

    `child_head_hash` still ties in the child's chain, so an audit walks failed children too.
    """

    child_run: str
    error: str
    child_head_hash: str = ""
    call_id: str = ""
    cancelled: bool = False
    retryable: bool = False


class RunResumed(Event, frozen=True, kw_only=True, tag="run.resumed"):
    """Attempt `attempt` of the turn took this run over from its record (the last holder died or
    froze): appended against the head it folded, so the old holder's next append is refused.

    `reused_calls` and `reused_cells` count the recorded model responses and cells before it;
    `in_flight` names the one step the record shows begun and not ended (it runs again);
    `sandbox` is where the run goes on: a fork of the last one, holding its REPL state as of its
    last completed cell, when a cell was in flight (docs/turns.md, "Resuming").
    """

    attempt: int
    replica: str
    reused_calls: int = 0
    reused_cells: int = 0
    in_flight: str = ""
    sandbox: str = ""


class RunCompleted(Event, frozen=True, kw_only=True, tag="run.completed"):
    """The run's final answer (SUBMIT), with the module's other outputs and what it took."""

    answer: str
    outputs: dict[str, Any] = {}
    iterations: int = 0
    llm_calls: int = 0
    answered_by: str = ""
    """The chat agent's module that answered (`cot`, `react`, `rlm`); empty for an RLM run."""
    fallback: str = ""
    """Why the answer is a lower module's, in the user's words (`TurnCompleted.fallback`)."""


class RunFailed(Event, frozen=True, kw_only=True, tag="run.failed"):
    """The run ended in an error; `retryable` says whether running it again may help."""

    error: str
    reason: str = ""
    retryable: bool = False


class RunCancelled(Event, frozen=True, kw_only=True, tag="run.cancelled"):
    """The run stopped at a step boundary because its turn (or its parent) was cancelled."""

    reason: str = ""
    partial_answer: str = ""


# -- child runs as work -------------------------------------------------------------------------

CHILD_RUN_WORK_SUBJECT = subjects.work("agent", "child_run")


class ChildRunWork(msgspec.Struct, frozen=True, kw_only=True):
    """The work item on `fleet.work.agent.child_run`: one child run of a tree, ready to start.

    Its `Nats-Msg-Id` is the child run id (derived from the parent run and its tool call), so a
    parent that publishes twice starts one child. The child sandbox is built by the parent
    (`build_child`) before the item is published; the replica that runs the child deletes it
    when the run ends. `deadline` is the tree's (seconds since the epoch): a child waiting on
    its own children waits no longer than its root may.
    """

    tenant: str
    session: str
    turn: str
    tree: str
    parent_run: str
    child_run: str
    call_id: str
    depth: int
    task: str
    sandbox: str
    context: str
    branch: str
    signature: str = "task -> answer"
    max_iters: int = 10
    max_llm_calls: int = 50
    max_output_chars: int = 10_000
    planner_role: str = "planner"
    delegate_role: str = "delegate"
    deadline: float = 0.0


TERMINAL: tuple[type[Event], ...] = (RunCompleted, RunFailed, RunCancelled)
"""A run whose last event is one of these has ended: nothing more is appended to its subject."""

EVENTS: tuple[type[Event], ...] = (
    RunStarted,
    IterationPlanned,
    CellExecuted,
    LlmCalled,
    ToolCalled,
    ToolReturned,
    Escalated,
    ComputeDecided,
    FellBack,
    ChildRunRequested,
    ChildRunCompleted,
    ChildRunFailed,
    RunResumed,
    RunCompleted,
    RunFailed,
    RunCancelled,
)
