"""The run kernel's lifecycle, pure: how an attempt begins from the record its subject holds,
the one terminal event an outcome appends, how that event reads back, and how the turn ends.
Both runners (the chat agent, the RLM engine) use these, so these tables are both runners'."""

from typing import Any

import pytest

from fleet_agent.run import lifecycle as lc
from fleet_agent.run.failures import RunBroke, RunFailure
from fleet_agent.runners import Answered, Failed, Stopped
from fleet_events import Event
from fleet_events.journal import fold
from fleet_events.run import (
    CellExecuted,
    IterationPlanned,
    LlmCalled,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
)

STARTED = RunStarted(kind="rlm", tree="tr", task="t", sandbox="sb-1")
CALL = LlmCalled(
    role="planner", model="m", prompt_tokens=1, completion_tokens=1, cost=0.0, latency_ms=1.0,
    request_kind="step", grant_id="r-g1", call_id="r-l1", index=1,
)  # fmt: skip
PLAN = IterationPlanned(index=0, reasoning="look", code="print(1)", llm_call="r-l1")
CELL = CellExecuted(code="print(1)", stdout="1\n", cell_id="r-c1", iteration=0, sandbox="sb-1")


def test_nothing_recorded_begins_fresh() -> None:
    assert lc.begin(fold([])) == lc.Fresh()


@pytest.mark.parametrize(
    "events",
    [[STARTED], [STARTED, CALL], [STARTED, CALL, PLAN, CELL]],
    ids=["started", "a call", "a cell"],
)
def test_a_record_without_an_end_is_taken_over(events: list[Event]) -> None:
    assert lc.begin(fold(events)) == lc.TakeOver()


@pytest.mark.parametrize(
    ("end", "outcome"),
    [
        (
            RunCompleted(answer="42", outputs={"module": "cot"}, iterations=2, llm_calls=3),
            lc.Completed(answer="42", outputs={"module": "cot"}, iterations=2, llm_calls=3),
        ),
        (
            RunCancelled(reason="user", partial_answer="so far"),
            lc.Cancelled(reason="user", partial="so far"),
        ),
        (
            RunFailed(error="the key was refused", reason="llm_auth_failed", retryable=False),
            lc.Failure(
                error="the key was refused",
                reason="llm_auth_failed",
                code="llm_auth_failed",
                retryable=False,
                stated=True,
            ),
        ),
        (
            RunFailed(error="gone", reason="sandbox_lost", retryable=True),
            lc.Failure(
                error="gone",
                reason="sandbox_lost",
                code="sandbox_lost",
                retryable=True,
                stated=False,
            ),
        ),
        (
            RunFailed(error="ValueError: x", reason="ValueError", retryable=False),
            lc.Failure(error="ValueError: x", reason="ValueError", code="runner_error"),
        ),
    ],
    ids=["completed", "cancelled", "stated", "sandbox lost", "broke"],
)
def test_a_record_that_ends_is_read_back_and_nothing_runs(end: Event, outcome: lc.Outcome) -> None:
    begun = lc.begin(fold([STARTED, CALL, end]))
    assert begun == lc.FromRecord(outcome)
    assert lc.recorded(end) == outcome


def test_an_end_event_of_no_known_kind_reads_as_a_broken_run() -> None:
    assert lc.recorded(STARTED) == lc.Failure(error="the run ended", reason="")


OUTCOMES: list[tuple[lc.Outcome, Event]] = [
    (
        lc.Completed(answer="a", outputs={"k": 1}, iterations=4, llm_calls=5),
        RunCompleted(answer="a", outputs={"k": 1}, iterations=4, llm_calls=5),
    ),
    (lc.Cancelled(reason="stop", partial="p"), RunCancelled(reason="stop", partial_answer="p")),
    (
        lc.Failure(error="e", reason="budget_spent", code="budget_spent", stated=True),
        RunFailed(error="e", reason="budget_spent", retryable=False),
    ),
    (
        lc.Failure(
            error="e", reason="llm_timeout", code="llm_timeout", retryable=True, stated=True
        ),
        RunFailed(error="e", reason="llm_timeout", retryable=True),
    ),
]


@pytest.mark.parametrize(("outcome", "event"), OUTCOMES, ids=["done", "cancel", "spent", "slow"])
def test_each_outcome_appends_one_terminal_event_that_reads_back(
    outcome: lc.Outcome, event: Event
) -> None:
    assert lc.ended(outcome) == event
    assert lc.recorded(lc.ended(outcome)) == outcome


def test_the_turn_ends_as_the_outcome_says() -> None:
    assert lc.turn_end(lc.Completed(answer="a"), "h1") == Answered("a", root_head_hash="h1")
    assert lc.turn_end(lc.Completed(answer="a")) == Answered("a", root_head_hash="")
    assert lc.turn_end(lc.Cancelled(reason="r", partial="p"), "h") == Stopped("p")
    stated = lc.Failure(error="msg", reason="llm_timeout", code="llm_timeout", retryable=True,
                        stated=True)  # fmt: skip
    assert lc.turn_end(stated) == Failed("msg", code="llm_timeout", retryable=True)


@pytest.mark.parametrize("code", ["runner_error", "sandbox_lost"])
def test_a_failure_the_run_cannot_state_raises_for_the_worker_with_its_code(code: str) -> None:
    with pytest.raises(RunBroke) as raised:
        lc.turn_end(lc.Failure(error="ValueError: secret text", reason="ValueError", code=code))
    assert raised.value.code == code
    assert str(raised.value) == "ValueError: secret text"  # the replica's log, never the turn's


class Secret(Exception):
    pass


def test_a_stated_failure_anywhere_in_the_chain_is_the_outcome() -> None:
    inner = RunFailure("the repository is unreachable", code="repo_unavailable")
    outer = RuntimeError("dspy wrapped it")
    outer.__cause__ = inner
    assert lc.failure(outer) == lc.Failure(
        error="the repository is unreachable", reason="repo_unavailable",
        code="repo_unavailable", retryable=False, stated=True,
    )  # fmt: skip
    slow = lc.failure(RunFailure("the model did not answer in 20 s", code="llm_timeout"))
    assert (slow.code, slow.retryable, slow.stated) == ("llm_timeout", True, True)


def test_a_broken_run_is_named_by_its_type_and_its_text_only_when_detailed() -> None:
    exc = Secret("sk-live-key in the text")
    assert lc.failure(exc) == lc.Failure(error="Secret", reason="Secret")
    detailed = lc.failure(exc, detailed=True)
    assert detailed == lc.Failure(error="Secret: sk-live-key in the text", reason="Secret")
    assert lc.failure(Secret("x" * 5000), detailed=True).error == ("Secret: " + "x" * 5000)[:2000]


def test_a_broken_run_with_a_known_code_keeps_it_and_its_flag() -> None:
    assert lc.failure(RunBroke("gone", code="sandbox_lost")) == lc.Failure(
        error="RunBroke", reason="RunBroke", code="sandbox_lost", retryable=True
    )
    assert lc.failure(RunBroke("x")).retryable is False  # runner_error: the record cannot say


def test_a_lost_sandbox_is_a_retryable_failure_stated_by_code_only() -> None:
    lost = lc.lost("its REPL state is gone")
    assert lost == lc.Failure(
        error="its REPL state is gone", reason="sandbox_lost", code="sandbox_lost",
        retryable=True, stated=False,
    )  # fmt: skip
    assert lc.ended(lost) == RunFailed(
        error="its REPL state is gone", reason="sandbox_lost", retryable=True
    )


def test_a_result_carries_a_stated_or_known_code_and_none_for_a_broken_run() -> None:
    assert lc.result_code(lc.Failure(error="e", reason="x", code="llm_timeout", stated=True)) == (
        "llm_timeout"
    )
    assert lc.result_code(lc.lost("gone")) == "sandbox_lost"
    assert lc.result_code(lc.Failure(error="e", reason="ValueError")) == ""


def _resumed(**kwargs: Any) -> RunResumed:
    journal = fold([STARTED, CALL, PLAN, CELL])
    return lc.taken_over(journal, attempt=2, replica="agent-1", **kwargs)


def test_taking_over_says_what_the_record_reuses_and_what_repeats() -> None:
    assert _resumed(sandbox="sb-2") == RunResumed(
        attempt=2, replica="agent-1", reused_calls=1, reused_cells=1,
        in_flight="model call 2 (no response recorded)", sandbox="sb-2",
    )  # fmt: skip


def test_the_runner_may_say_better_what_repeats_and_what_it_reuses() -> None:
    resumed = _resumed(in_flight="tool call t1 (search, no result recorded)", reused_calls=0)
    assert (resumed.in_flight, resumed.reused_calls, resumed.sandbox) == (
        "tool call t1 (search, no result recorded)", 0, "",
    )  # fmt: skip
