"""The run journal: a run's record folded into the ordered steps it took. Pure: no I/O.

Both readers of a run's record use it: the agent resuming a run whose replica died (issue 16)
and `fleet replay` re-executing a session offline (issue 13). Each keeps what it needs to answer
without paying again:

- every model call, by its position (`index`) and its request's digest (`request_hash`), with
  the response as recorded (inline text, or a `BlobRef` the caller fetches);
- every cell, by its position (`cell_id` `<run>-c<n>`), with its code and what it answered;
- every host tool call (`call_id`), and whether it returned;
- every child run, by id, with its answer or error once the parent recorded it.

`step_key` names each event by the step it records, so a resumed run can tell a step it is
about to record from one its record already holds (it records nothing twice). What a run had
begun and not finished when its record stops is `in_flight`: the one step a resume repeats.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet_events.envelope import BlobRef, Event
from fleet_events.run import (
    TERMINAL,
    CellExecuted,
    ChildRunCompleted,
    ChildRunFailed,
    ChildRunRequested,
    IterationPlanned,
    LlmCalled,
    RunResumed,
    RunStarted,
    ToolCalled,
    ToolReturned,
)


@dataclass(frozen=True)
class RecordedCall:
    """One model call as recorded."""

    index: int
    call_id: str
    request_hash: str
    response: str | BlobRef
    kind: str
    cell: str
    role: str
    error: str = ""
    error_code: str = ""
    retried: bool = False
    """It failed and was asked again (the next call with its digest is the retry)."""
    http_status: int = 0
    retry_after_s: float | None = None
    grant_id: str = ""
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    """What its usage report said: a resumed run sends it again (the budget answers a report
    it holds by its id), in case the replica died with the report in flight."""


@dataclass(frozen=True)
class RecordedCell:
    """One cell as recorded; `outcome` is filled in for records older than the field."""

    cell_id: str
    position: int
    code: str
    stdout: str
    stdout_blob: BlobRef | None
    error: str
    final: dict[str, Any] | None
    value: Any
    outcome: str
    iteration: int | None
    context: str
    sandbox: str


@dataclass
class RecordedTool:
    call_id: str
    tool: str
    cell: str
    args: dict[str, Any]
    returned: bool = False
    result: Any = None
    error: str = ""


@dataclass
class RecordedChild:
    child_run: str
    call_id: str
    batch_index: int
    task: str
    ended: bool = False
    answer: str | None = None
    error: str = ""
    head_hash: str = ""


@dataclass
class Journal:
    """What a run's record says it did, in order."""

    started: RunStarted | None = None
    calls: list[RecordedCall] = field(default_factory=list)
    cells: list[RecordedCell] = field(default_factory=list)
    plans: dict[int, IterationPlanned] = field(default_factory=dict)
    tools: dict[str, RecordedTool] = field(default_factory=dict)
    children: dict[str, RecordedChild] = field(default_factory=dict)
    ended: Event | None = None
    resumes: list[RunResumed] = field(default_factory=list)
    sandbox: str = ""
    """The sandbox the run's REPL state lives in: `run.started`'s, or the last resume's."""
    keys: set[str] = field(default_factory=set)
    events: int = 0

    def cell(self, position: int) -> RecordedCell | None:
        """The recorded cell at `position` (1-based, as in `cell_id`), if any."""
        return self.cells[position - 1] if 0 < position <= len(self.cells) else None

    @property
    def max_call_index(self) -> int:
        return max((c.index for c in self.calls), default=0)

    @property
    def contexts(self) -> list[str]:
        """The REPL contexts the run's cells ran in, first one first."""
        seen: list[str] = []
        for cell in self.cells:
            if cell.context and cell.context not in seen:
                seen.append(cell.context)
        return seen

    @property
    def cell_in_flight(self) -> bool:
        """May a cell of the run still be running in its sandbox (its holder died in it)?"""
        return self.in_flight.startswith("cell")

    @property
    def in_flight(self) -> str:
        """The step begun and not recorded as done when the record stops ("" when none)."""
        if self.ended is not None:
            return ""
        open_children = [c.child_run for c in self.children.values() if not c.ended]
        if open_children:
            return f"cell {len(self.cells) + 1} (waiting on child runs {', '.join(open_children)})"
        open_tools = [t.call_id for t in self.tools.values() if not t.returned]
        if open_tools:
            return f"cell {len(self.cells) + 1} (in host tool call {open_tools[0]})"
        planned = max(self.plans, default=-1)
        ran = max((c.iteration for c in self.cells if c.iteration is not None), default=-1)
        if planned > ran:
            return f"cell {len(self.cells) + 1} (iteration {planned}, planned, no result recorded)"
        return f"model call {self.max_call_index + 1} (no response recorded)"


def outcome_of(cell: CellExecuted) -> str:
    """How a cell ended, for records made before `outcome` was recorded."""
    if cell.outcome:
        return cell.outcome
    if cell.final is not None:
        return "final"
    if cell.error.startswith("SyntaxError"):
        return "syntax"
    if cell.error.startswith("CodeExecutionError"):
        return "error"
    if cell.error:
        return "terminal"
    return "result"


def step_key(event: Event) -> str | None:
    """The step an event records: two events with one key record the same step (a resumed
    run never appends a second). None: the event is not a step of the journal."""
    match event:
        case RunStarted():
            return "started"
        case IterationPlanned(index=index):
            return f"plan:{index}"
        case LlmCalled(call_id=call_id, index=index):
            return f"llm:{call_id or index}"
        case CellExecuted(cell_id=cell_id):
            return f"cell:{cell_id}" if cell_id else None
        case ToolCalled(call_id=call_id):
            return f"tool:{call_id}"
        case ToolReturned(call_id=call_id):
            return f"returned:{call_id}"
        case ChildRunRequested(child_run=child):
            return f"child:{child}"
        case ChildRunCompleted(child_run=child) | ChildRunFailed(child_run=child):
            return f"child-end:{child}"
        case _ if isinstance(event, TERMINAL):
            return "ended"
    return None


def evolve(journal: Journal, event: Event) -> Journal:
    """Fold one event of the run's subject (mutating `journal`, returned for chaining)."""
    journal.events += 1
    key = step_key(event)
    if key is not None:
        journal.keys.add(key)
    match event:
        case RunStarted():
            journal.started = event
            journal.sandbox = event.sandbox
        case LlmCalled():
            journal.calls.append(_call(event))
        case IterationPlanned():
            journal.plans[event.index] = event
        case CellExecuted():
            journal.cells.append(_cell(event, len(journal.cells) + 1))
        case ToolCalled():
            journal.tools[event.call_id] = RecordedTool(
                event.call_id, event.tool, event.cell, event.args
            )
        case ToolReturned():
            tool = journal.tools.setdefault(
                event.call_id, RecordedTool(event.call_id, event.tool, "", {})
            )
            tool.returned, tool.result, tool.error = True, event.result, event.error
        case ChildRunRequested():
            journal.children[event.child_run] = RecordedChild(
                event.child_run, event.call_id, event.batch_index, event.task
            )
        case ChildRunCompleted():
            child = _child(journal, event.child_run, event.call_id)
            child.ended, child.answer, child.head_hash = True, event.answer, event.child_head_hash
        case ChildRunFailed():
            child = _child(journal, event.child_run, event.call_id)
            child.ended, child.error, child.head_hash = True, event.error, event.child_head_hash
        case RunResumed():
            journal.resumes.append(event)
            journal.sandbox = event.sandbox or journal.sandbox
        case _ if isinstance(event, TERMINAL):
            journal.ended = event
    return journal


def fold(events: Iterable[Event]) -> Journal:
    journal = Journal()
    for event in events:
        evolve(journal, event)
    return journal


def _call(event: LlmCalled) -> RecordedCall:
    return RecordedCall(
        index=event.index, call_id=event.call_id, request_hash=event.request_hash,
        response=event.response, kind=event.request_kind, cell=event.cell, role=event.role,
        error=event.error, error_code=event.error_code, retried=event.retry_in_s > 0,
        http_status=event.http_status, retry_after_s=event.retry_after_s,
        grant_id=event.grant_id, model=event.model, prompt_tokens=event.prompt_tokens,
        completion_tokens=event.completion_tokens, cost=event.cost,
    )  # fmt: skip


def _cell(event: CellExecuted, position: int) -> RecordedCell:
    return RecordedCell(
        cell_id=event.cell_id, position=position, code=event.code, stdout=event.stdout,
        stdout_blob=event.stdout_blob, error=event.error, final=event.final, value=event.value,
        outcome=outcome_of(event), iteration=event.iteration, context=event.context,
        sandbox=event.sandbox,
    )  # fmt: skip


def _child(journal: Journal, child_run: str, call_id: str) -> RecordedChild:
    return journal.children.setdefault(child_run, RecordedChild(child_run, call_id, 0, ""))
