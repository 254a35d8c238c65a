"""Run context: the steps of one run (`fleet.session.<tenant>.<session>.run.<run>`).

Each run has its own subject, written only by the replica executing it, so every run is its
own hash chain. The agent issue fills in the detail of each step; the shapes start here.
"""

from fleet_events.envelope import Event


class RunStarted(Event, frozen=True, kw_only=True, tag="run.started"):
    kind: str
    tree: str
    depth: int = 0
    task: str = ""


class CellExecuted(Event, frozen=True, kw_only=True, tag="run.cell_executed"):
    code: str
    stdout: str = ""
    error: str = ""
    duration_ms: float = 0.0


class LlmCalled(Event, frozen=True, kw_only=True, tag="run.llm_called"):
    role: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0


class ChildRunRequested(Event, frozen=True, kw_only=True, tag="run.child_requested"):
    child_run: str
    task: str


class ChildRunCompleted(Event, frozen=True, kw_only=True, tag="run.child_completed"):
    child_run: str
    answer: str
    child_head_hash: str


class RunCompleted(Event, frozen=True, kw_only=True, tag="run.completed"):
    answer: str


class RunFailed(Event, frozen=True, kw_only=True, tag="run.failed"):
    error: str


EVENTS: tuple[type[Event], ...] = (
    RunStarted,
    CellExecuted,
    LlmCalled,
    ChildRunRequested,
    ChildRunCompleted,
    RunCompleted,
    RunFailed,
)
