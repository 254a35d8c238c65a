"""The budget's decisions that were made outside `decide` before the decider kernel: a tenant's
refusal of a grant, a second close, cost charges and releases on a tenant's day; and the
scratch copy a group commit decides on."""

from fleet_budget.domain import (
    Decision,
    TenantDayState,
    TreeState,
    charge_cost,
    decide,
    evolve,
    release,
)
from fleet_budget.handlers import TREES
from fleet_events import Actor, Envelope, Event, utc_now
from fleet_events.budget import (
    CloseTree,
    Grant,
    Granted,
    GrantRefused,
    TenantCharged,
    TenantRefused,
    TenantReleased,
    TreeClosed,
)
from fleet_mesh.decider import provisional

from .test_domain import given, grant, opened

REFUSAL = TenantRefused(
    tree="t1", calls=1, reason="tenant_calls_exhausted", remaining_calls=0, message="cap 3"
)


def test_a_grant_the_tree_would_give_is_refused_when_the_tenant_declined_its_charge() -> None:
    decision = decide(given(opened(calls=5)), grant(), tenant_refusal=REFUSAL)

    assert decision.new
    assert decision.event == GrantRefused(
        run="root", calls=1, reason="tenant_calls_exhausted", remaining=5,
        message="budget spent: cap 3",
    )  # fmt: skip
    assert decision.events == (decision.event,)


def test_a_grant_the_tree_refuses_itself_keeps_the_trees_reason() -> None:
    decision = decide(given(opened(calls=0)), grant(), tenant_refusal=REFUSAL)

    assert isinstance(decision.event, GrantRefused)
    assert decision.event.reason == "calls_exhausted"


def test_a_retried_grant_keeps_its_original_answer_whatever_the_tenant_says_now() -> None:
    state = given(opened(calls=5))
    evolve(state, "r1", Granted(run="root", calls=1, granted_total=1, remaining=4))

    decision = decide(state, grant("r1"), tenant_refusal=REFUSAL)

    assert decision == Decision(Granted(run="root", calls=1, granted_total=1, remaining=4), False)
    assert decision.events == ()


def test_closing_a_closed_tree_stores_nothing_and_a_retried_close_gets_its_original() -> None:
    state = given(opened(), TreeClosed(reason="done"))  # stored as e1

    again = decide(state, CloseTree(request_id="c2", tree="t1", reason="again"))
    retried = decide(state, CloseTree(request_id="e1", tree="t1", reason="done"))

    assert again == Decision(TreeClosed(reason="already closed"), new=False)
    assert retried == Decision(TreeClosed(reason="done"), new=False)


def test_a_cost_charge_and_a_release_are_each_stored_once() -> None:
    day = TenantDayState()
    charged = charge_cost(day, "r1:tenant", "t1", 0.25)
    assert charged == Decision(TenantCharged(tree="t1", cost=0.25), new=True)
    day.decisions["r1:tenant"] = charged.event
    assert charge_cost(day, "r1:tenant", "t1", 9.0) == Decision(charged.event, new=False)

    released = release(day, "r2:released", "t1", "r2:tenant", 3)
    assert released == Decision(TenantReleased(tree="t1", charge="r2:tenant", calls=3), new=True)
    day.decisions["r2:released"] = released.event
    assert release(day, "r2:released", "t1", "r2:tenant", 3).events == ()


def test_a_group_commits_scratch_copy_shares_nothing_a_grant_writes() -> None:
    state = given(opened(calls=5, max_steps_per_run=4))
    step = Grant(request_id="s1", tree="t1", run="root", calls=1, kind="step")
    event = decide(state, step).event
    assert isinstance(event, Granted)

    scratch = TREES.clone(state)
    wrapped = provisional("t", _envelope(event))
    TREES.evolve(scratch, wrapped)

    assert scratch.steps == {"root": 1}
    assert state.steps == {}  # a lost race leaves the cached tree as it was
    assert "s1" not in state.decisions
    assert isinstance(state, TreeState)


def _envelope(event: Granted) -> Envelope[Event]:
    return Envelope(id="s1", tenant="acme", actor=Actor(service="budget", replica="b"),
                    ts=utc_now(), data=event)  # fmt: skip
