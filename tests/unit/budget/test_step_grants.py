"""A run's own steps (`Grant.kind="step"`) are bounded per run, never by the tree's
`max_llm_calls` (DESIGN.md §5): a root that plans ten iterations must not starve its
`llm_query` calls, and a tree whose sub calls are spent can still finish its runs' steps."""

import pytest

from fleet_budget.domain import Decision, TreeState, decide, evolve, validate
from fleet_budget.errors import Malformed
from fleet_events.budget import (
    Grant,
    Granted,
    GrantRefused,
    OpenTree,
    TreeClosed,
    TreeOpened,
    UsageRecorded,
)
from fleet_events.envelope import Event


def given(*events: Event) -> TreeState:
    state = TreeState()
    for index, event in enumerate(events):
        evolve(state, f"e{index}", event)
    return state


def opened(calls: int = 2, steps: int | None = 3, **limits: object) -> TreeOpened:
    return TreeOpened(
        tree="t1", tenant="acme", max_llm_calls=calls, max_depth=2,
        max_steps_per_run=steps, **limits,  # type: ignore[arg-type]
    )  # fmt: skip


def step(request_id: str, run: str = "root", calls: int = 1) -> Grant:
    return Grant(request_id=request_id, tree="t1", run=run, calls=calls, kind="step")


def sub(request_id: str, run: str = "root", calls: int = 1) -> Grant:
    return Grant(request_id=request_id, tree="t1", run=run, calls=calls)


def test_a_step_grant_leaves_the_trees_call_count_alone() -> None:
    state = given(opened(calls=2))
    decision = decide(state, step("s1"))
    assert decision == Decision(
        Granted(run="root", calls=1, granted_total=0, remaining=2, kind="step"), new=True
    )
    evolve(state, "s1", decision.event)
    assert (state.granted, state.remaining, state.steps) == (0, 2, {"root": 1})


def test_steps_are_granted_when_the_sub_calls_are_spent() -> None:
    state = given(opened(calls=1), Granted(run="root", calls=1, granted_total=1, remaining=0))
    assert isinstance(decide(state, sub("x")).event, GrantRefused)
    assert decide(state, step("s1")).event == Granted(
        run="root", calls=1, granted_total=1, remaining=0, kind="step"
    )


def test_each_run_has_its_own_step_allowance_and_the_refusal_says_whose() -> None:
    state = given(opened(steps=2))
    for index in range(2):
        evolve(state, f"s{index}", decide(state, step(f"s{index}")).event)
    refused = decide(state, step("s9")).event
    assert refused == GrantRefused(
        run="root", calls=1, reason="calls_exhausted", remaining=2,
        message="budget spent: run 'root' asked for 1 step call(s) with 2 of its 2 used "
        "(max_iters plus the extract step)",
    )  # fmt: skip
    assert isinstance(decide(state, step("c1", run="child")).event, Granted)
    assert state.remaining == 2  # sub calls untouched by any of it


def test_no_step_cap_means_steps_are_bounded_by_the_engine_alone() -> None:
    state = given(opened(steps=None))
    for index in range(50):
        evolve(state, f"s{index}", decide(state, step(f"s{index}")).event)
    assert state.steps == {"root": 50}
    assert state.remaining == 2


def test_a_closed_tree_refuses_steps_too() -> None:
    state = given(opened(), TreeClosed(reason="turn ended"))
    event = decide(state, step("s1")).event
    assert isinstance(event, GrantRefused)
    assert event.reason == "tree_closed"


@pytest.mark.parametrize(
    ("limits", "usage", "reason"),
    [
        ({"max_tokens": 10}, UsageRecorded(run="root", prompt_tokens=10), "tokens_exhausted"),
        ({"max_cost": 0.5}, UsageRecorded(run="root", cost=0.5), "cost_exhausted"),
    ],
)
def test_token_and_cost_caps_bind_steps(
    limits: dict[str, object], usage: Event, reason: str
) -> None:
    state = given(opened(2, 3, **limits), usage)
    event = decide(state, step("s1")).event
    assert isinstance(event, GrantRefused)
    assert event.reason == reason


def test_a_retried_step_gets_its_original_answer_and_counts_once() -> None:
    state = given(opened())
    first = decide(state, step("s1"))
    evolve(state, "s1", first.event)
    assert decide(state, step("s1")) == Decision(first.event, new=False)
    assert state.steps == {"root": 1}


def test_a_request_id_reused_for_the_other_kind_is_malformed() -> None:
    state = given(opened())
    evolve(state, "s1", decide(state, step("s1")).event)
    with pytest.raises(Malformed, match="already answered a different request"):
        decide(state, sub("s1"))


def test_open_validates_the_step_cap() -> None:
    for bad in (0, -1, 10_001):
        command = OpenTree(
            request_id="o1", tenant="acme", tree="t1", max_llm_calls=5, max_steps_per_run=bad
        )
        with pytest.raises(Malformed, match=f"invalid max_steps_per_run {bad}"):
            validate(command)


def test_open_records_the_step_cap() -> None:
    command = OpenTree(
        request_id="o1", tenant="acme", tree="t1", max_llm_calls=5, max_steps_per_run=7
    )
    event = decide(TreeState(), command, tenant_day="2026-12-01").event
    assert isinstance(event, TreeOpened)
    assert event.max_steps_per_run == 7
