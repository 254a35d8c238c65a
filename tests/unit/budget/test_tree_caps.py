"""`max_tree_calls` bounds every grant of a tree, steps and sub calls of every run alike, and
`max_child_runs` the children it admits at every depth (issue 27, H1): the caps a model-written
`sub_rlm` loop cannot get round. Pure decisions over a folded ledger."""

import pytest

from fleet_budget.domain import TreeState, decide, evolve, status, validate
from fleet_budget.errors import Malformed
from fleet_events.budget import (
    AdmitChild,
    ChildAdmitted,
    ChildRefused,
    Grant,
    Granted,
    GrantRefused,
    OpenTree,
    TreeOpened,
)
from fleet_events.envelope import Event


def given(*events: Event) -> TreeState:
    state = TreeState()
    for index, event in enumerate(events):
        evolve(state, f"e{index}", event)
    return state


def opened(tree_calls: int | None = 3, children: int | None = 2) -> TreeOpened:
    return TreeOpened(
        tree="t1", tenant="acme", max_llm_calls=100, max_depth=3, max_steps_per_run=100,
        max_tree_calls=tree_calls, max_child_runs=children,
    )  # fmt: skip


def grant(request_id: str, kind: str = "sub", calls: int = 1, run: str = "root") -> Grant:
    return Grant(request_id=request_id, tree="t1", run=run, calls=calls, kind=kind)  # type: ignore[arg-type]


def admit(request_id: str, depth: int = 1) -> AdmitChild:
    return AdmitChild(
        request_id=request_id, tree="t1", parent_run="root", child_run=f"c-{request_id}",
        depth=depth,
    )  # fmt: skip


def apply(state: TreeState, request_id: str, command: Grant | AdmitChild) -> Event:
    decision = decide(state, command)
    evolve(state, request_id, decision.event)
    return decision.event


def test_steps_sub_calls_and_other_runs_all_count_against_the_tree_cap() -> None:
    state = given(opened(tree_calls=3))
    assert isinstance(apply(state, "a", grant("a", "step")), Granted)
    assert isinstance(apply(state, "b", grant("b", "sub")), Granted)
    assert isinstance(apply(state, "c", grant("c", "step", run="child")), Granted)
    assert state.tree_calls == 3
    for kind in ("step", "sub"):
        refused = apply(state, f"x-{kind}", grant(f"x-{kind}", kind))
        assert isinstance(refused, GrantRefused)
        assert refused.reason == "tree_calls_exhausted"
        assert "3 of the tree's max_tree_calls 3 granted" in refused.message
    assert status(state, 9).tree_calls == 3


def test_a_batch_is_all_or_nothing_against_the_tree_cap() -> None:
    state = given(opened(tree_calls=3), Granted(run="root", calls=1, granted_total=1, remaining=9))
    refused = apply(state, "b", grant("b", calls=3))
    assert isinstance(refused, GrantRefused)
    assert refused.reason == "tree_calls_exhausted"
    assert isinstance(apply(state, "c", grant("c", calls=2)), Granted)
    assert state.tree_calls == 3


def test_a_retried_grant_is_answered_once_and_counted_once() -> None:
    state = given(opened(tree_calls=2))
    first = apply(state, "a", grant("a"))
    again = decide(state, grant("a"))
    assert (again.event, again.new) == (first, False)
    assert state.tree_calls == 1


def test_a_tree_opened_before_the_cap_existed_is_unbounded_by_it() -> None:
    state = given(opened(tree_calls=None, children=None))
    for n in range(50):
        assert isinstance(apply(state, f"s{n}", grant(f"s{n}", "step")), Granted)
    for n in range(50):
        assert isinstance(apply(state, f"k{n}", admit(f"k{n}")), ChildAdmitted)


def test_child_runs_are_counted_over_the_whole_tree() -> None:
    state = given(opened(children=2))
    assert isinstance(apply(state, "a", admit("a", depth=1)), ChildAdmitted)
    assert isinstance(apply(state, "b", admit("b", depth=2)), ChildAdmitted)
    refused = apply(state, "c", admit("c", depth=1))
    assert isinstance(refused, ChildRefused)
    assert refused.reason == "child_runs_exhausted"
    assert "max_child_runs 2" in refused.message
    assert (state.child_runs, status(state, 3).child_runs) == (2, 2)


def test_depth_is_refused_before_the_count() -> None:
    state = given(opened(children=0))
    refused = apply(state, "deep", admit("deep", depth=4))
    assert isinstance(refused, ChildRefused)
    assert refused.reason == "depth_limit"


@pytest.mark.parametrize(
    ("field", "value"), [("max_tree_calls", 0), ("max_tree_calls", True), ("max_child_runs", -1)]
)
def test_a_bad_cap_is_malformed_naming_it(field: str, value: int) -> None:
    command = OpenTree(request_id="r", tenant="acme", tree="t1", max_llm_calls=1, **{field: value})  # type: ignore[arg-type]
    with pytest.raises(Malformed, match=field):
        validate(command)
