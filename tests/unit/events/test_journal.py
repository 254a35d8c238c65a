"""The run journal: a run's events folded into its ordered steps, each keyed so a resumed run
records nothing twice, and the one step in flight named."""

from typing import Any

from fleet_events import journal as jr
from fleet_events.envelope import BlobRef
from fleet_events.run import (
    CellExecuted,
    ChildRunCompleted,
    ChildRunFailed,
    ChildRunRequested,
    IterationPlanned,
    LlmCalled,
    RunCompleted,
    RunResumed,
    RunStarted,
    ToolCalled,
    ToolReturned,
)

STARTED = RunStarted(kind="rlm", tree="tree", sandbox="sbx")


def step_call(index: int, response: str = "plan", digest: str = "") -> LlmCalled:
    return LlmCalled(
        role="planner", model="m", call_id=f"r-l{index}", index=index, request_kind="step",
        grant_id=f"r-g{index}", response=response, request_hash=digest or f"h{index}",
    )  # fmt: skip


def cell(n: int, code: str, **fields: Any) -> CellExecuted:
    return CellExecuted(code=code, cell_id=f"r-c{n}", iteration=n - 1, context="ctx", **fields)


def test_a_run_folds_into_its_calls_cells_tools_and_children_in_order() -> None:
    blob = BlobRef(object="t/abc", sha256="abc", size=40_000)
    journal = jr.fold(
        [
            STARTED,
            step_call(1),
            IterationPlanned(index=0, code="x = 1", llm_call="r-l1"),
            cell(1, "x = 1", stdout="", outcome="result"),
            step_call(2, response="big"),
            IterationPlanned(index=1, code="sub_rlm('a')"),
            ToolCalled(call_id="r-c2-t1", tool="sub_rlm", cell="r-c2"),
            ChildRunRequested(child_run="kid", task="a", call_id="r-c2-t1"),
            ChildRunCompleted(child_run="kid", answer="A", child_head_hash="hh", call_id="r-c2-t1"),
            ToolReturned(call_id="r-c2-t1", tool="sub_rlm", result="A"),
            cell(2, "sub_rlm('a')", stdout_blob=blob, stdout="cut", outcome="result"),
        ]
    )
    assert journal.started == STARTED
    assert [(c.index, c.request_hash, c.kind) for c in journal.calls] == [
        (1, "h1", "step"),
        (2, "h2", "step"),
    ]
    assert [c.cell_id for c in journal.cells] == ["r-c1", "r-c2"]
    assert journal.cell(2) is journal.cells[1]
    assert (journal.cell(3), journal.cell(0)) == (None, None)
    assert journal.cells[1].stdout_blob == blob
    tool = journal.tools["r-c2-t1"]
    assert (tool.returned, tool.result) == (True, "A")
    kid = journal.children["kid"]
    assert (kid.ended, kid.answer, kid.head_hash) == (True, "A", "hh")
    assert journal.contexts == ["ctx"]
    assert journal.max_call_index == 2
    assert journal.ended is None
    assert journal.events == 11


def test_every_step_has_one_key_and_the_same_step_recorded_again_has_the_same_key() -> None:
    events = [
        STARTED,
        step_call(1),
        IterationPlanned(index=0),
        cell(1, "x"),
        ToolCalled(call_id="t1", tool="f"),
        ToolReturned(call_id="t1", tool="f"),
        ChildRunRequested(child_run="k", task="a"),
        ChildRunFailed(child_run="k", error="no"),
        RunCompleted(answer="42"),
    ]
    keys = [jr.step_key(e) for e in events]
    assert None not in keys
    assert len(set(keys)) == len(keys)
    assert jr.step_key(cell(1, "other code")) == jr.step_key(events[3])
    assert jr.step_key(ChildRunCompleted(child_run="k", answer="", child_head_hash="")) == keys[7]
    assert jr.step_key(RunResumed(attempt=2, replica="r")) is None  # every attempt may add one
    assert jr.step_key(CellExecuted(code="x")) is None  # a cell without a position is no step
    assert jr.fold(events).keys == set(keys)


def test_the_step_in_flight_is_named_from_where_the_record_stops() -> None:
    planned = [STARTED, step_call(1), IterationPlanned(index=0, code="x = 1")]
    assert jr.fold(planned).in_flight.startswith("cell 1 (iteration 0, planned")
    ran = [*planned, cell(1, "x = 1")]
    assert jr.fold(ran).in_flight == "model call 2 (no response recorded)"
    waiting = [*ran, ChildRunRequested(child_run="kid", task="a")]
    assert jr.fold(waiting).in_flight == "cell 2 (waiting on child runs kid)"
    tool = [*ran, ToolCalled(call_id="r-c2-t1", tool="f")]
    assert jr.fold(tool).in_flight == "cell 2 (in host tool call r-c2-t1)"
    assert jr.fold([*ran, RunCompleted(answer="1")]).in_flight == ""


def test_a_cell_recorded_before_outcome_existed_gets_it_from_its_error_and_final() -> None:
    assert jr.outcome_of(CellExecuted(code="x", final={"answer": 1})) == "final"
    assert jr.outcome_of(CellExecuted(code="x", error="SyntaxError: bad")) == "syntax"
    assert jr.outcome_of(CellExecuted(code="x", error="CodeExecutionError: boom")) == "error"
    assert jr.outcome_of(CellExecuted(code="x", error="CodeInterpreterError: gone")) == "terminal"
    assert jr.outcome_of(CellExecuted(code="x", stdout="1")) == "result"
    assert jr.outcome_of(CellExecuted(code="x", outcome="error")) == "error"


def test_resumes_and_the_end_are_kept() -> None:
    resumed = RunResumed(attempt=2, replica="b", reused_calls=1)
    journal = jr.fold([STARTED, resumed, RunCompleted(answer="42")])
    assert journal.resumes == [resumed]
    assert isinstance(journal.ended, RunCompleted)
