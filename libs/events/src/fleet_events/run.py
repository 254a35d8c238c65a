"""Run context: the steps of one run (`fleet.session.<tenant>.<session>.run.<run>`).

Each run has its own subject, written only by the replica executing it, so every run is its
own hash chain. The agent issue fills in the detail of each step; the shapes start here.
"""

from fleet_events.envelope import Event


class RunStarted(Event, frozen=True, kw_only=True, tag="run.started"):
    """A run (chat agent or RLM, root or child) began within a budget tree."""

    kind: str
    tree: str
    depth: int = 0
    task: str = ""


class CellExecuted(Event, frozen=True, kw_only=True, tag="run.cell_executed"):
    """One code cell ran in the run's sandbox context."""

    code: str
    stdout: str = ""
    error: str = ""
    duration_ms: float = 0.0


class LlmCalled(Event, frozen=True, kw_only=True, tag="run.llm_called"):
    """One LM call of the run, with role, model, tokens, cost and latency."""

    role: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0


class ChildRunRequested(Event, frozen=True, kw_only=True, tag="run.child_requested"):
    """`sub_rlm` asked for a child run."""

    child_run: str
    task: str


class ChildRunCompleted(Event, frozen=True, kw_only=True, tag="run.child_completed"):
    """A child run's answer, with the head hash of the child's chain."""

    child_run: str
    answer: str
    child_head_hash: str


class RunCompleted(Event, frozen=True, kw_only=True, tag="run.completed"):
    """The run's final answer (SUBMIT)."""

    answer: str


class RunFailed(Event, frozen=True, kw_only=True, tag="run.failed"):
    """The run ended in an error."""

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
