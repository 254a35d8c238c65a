"""Given a ledger (events), when a command arrives, then this event answers it."""

import re

import pytest

from fleet_budget.domain import (
    Decision,
    TenantCaps,
    TenantDayState,
    TreeState,
    charge_tenant,
    decide,
    evolve,
    evolve_tenant,
    validate,
)
from fleet_budget.errors import Malformed, UnknownTree
from fleet_events.budget import (
    AdmitChild,
    ChildAdmitted,
    ChildRefused,
    CloseTree,
    Grant,
    Granted,
    GrantRefused,
    OpenRefused,
    OpenTree,
    RecordUsage,
    TenantCharged,
    TenantRefused,
    TenantReleased,
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


def opened(calls: int = 10, **limits: object) -> TreeOpened:
    fields: dict[str, object] = {"max_depth": 2, **limits}
    return TreeOpened(tree="t1", tenant="acme", max_llm_calls=calls, **fields)  # type: ignore[arg-type]


def grant(request_id: str = "r1", calls: int = 1) -> Grant:
    return Grant(request_id=request_id, tree="t1", run="root", calls=calls)


def test_open_on_a_new_tree_records_its_limits() -> None:
    command = OpenTree(request_id="o1", tenant="acme", tree="t1", max_llm_calls=5, max_depth=2)
    decision = decide(TreeState(), command, tenant_day="2026-11-30")
    assert decision == Decision(
        TreeOpened(tree="t1", tenant="acme", max_llm_calls=5, max_depth=2, tenant_day="2026-11-30"),
        new=True,
    )


def test_a_second_open_with_a_new_request_id_is_refused_and_the_first_limits_stand() -> None:
    state = given(opened(calls=5))
    decision = decide(state, OpenTree(request_id="o2", tenant="acme", tree="t1", max_llm_calls=99))
    assert isinstance(decision.event, OpenRefused)
    assert decision.event.reason == "already_open"
    assert "max_llm_calls=5" in decision.event.message


def test_a_grant_within_the_limit_is_granted_with_the_remaining_amount() -> None:
    decision = decide(given(opened(calls=10)), grant(calls=3))
    assert decision.event == Granted(run="root", calls=3, granted_total=3, remaining=7)


def test_a_grant_is_all_or_nothing_and_a_refusal_names_the_remaining_amount() -> None:
    state = given(opened(calls=10), Granted(run="root", calls=8, granted_total=8, remaining=2))
    decision = decide(state, grant("r2", calls=3))
    assert isinstance(decision.event, GrantRefused)
    assert (decision.event.reason, decision.event.remaining) == ("calls_exhausted", 2)
    assert decision.event.message.startswith("budget spent: ")


def test_a_retried_grant_gets_the_original_decision_and_grants_nothing_more() -> None:
    state = given(opened(calls=10))
    first = decide(state, grant("r1"))
    evolve(state, "r1", first.event)
    again = decide(state, grant("r1"))
    assert again == Decision(first.event, new=False)
    assert state.granted == 1


def test_a_request_id_reused_for_another_request_is_malformed() -> None:
    state = given(opened(calls=10))
    evolve(state, "r1", decide(state, grant("r1", calls=1)).event)
    with pytest.raises(Malformed, match="already answered a different request"):
        decide(state, grant("r1", calls=2))
    with pytest.raises(Malformed, match="already answered"):
        decide(state, CloseTree(request_id="r1", tree="t1"))


def test_grants_on_an_unknown_tree_are_an_error_not_an_event() -> None:
    with pytest.raises(UnknownTree, match="open it first"):
        decide(TreeState(), grant())


def test_token_and_cost_caps_are_checked_against_recorded_usage() -> None:
    tokens = given(
        opened(calls=10, max_tokens=100),
        UsageRecorded(run="root", prompt_tokens=60, completion_tokens=40),
    )
    event = decide(tokens, grant("r2")).event
    assert isinstance(event, GrantRefused)
    assert event.reason == "tokens_exhausted"
    cost = given(opened(calls=10, max_cost=0.5), UsageRecorded(run="root", cost=0.49))
    assert isinstance(decide(cost, grant("r2")).event, Granted)
    evolve(cost, "u2", UsageRecorded(run="root", cost=0.01))
    refused = decide(cost, grant("r3")).event
    assert isinstance(refused, GrantRefused)
    assert refused.reason == "cost_exhausted"


def test_a_closed_tree_refuses_grants_and_children_but_records_usage() -> None:
    state = given(opened(), TreeClosed(reason="turn done"))
    event = decide(state, grant("r9")).event
    assert isinstance(event, GrantRefused)
    assert event.reason == "tree_closed"
    child = decide(
        state, AdmitChild(request_id="a1", tree="t1", parent_run="root", child_run="c", depth=1)
    ).event
    assert isinstance(child, ChildRefused)
    usage = decide(state, RecordUsage(request_id="u1", tree="t1", run="root", cost=0.1)).event
    assert isinstance(usage, UsageRecorded)


@pytest.mark.parametrize(("depth", "admitted"), [(1, True), (2, True), (3, False)])
def test_children_are_admitted_up_to_and_including_max_depth(depth: int, admitted: bool) -> None:
    command = AdmitChild(request_id="a1", tree="t1", parent_run="p", child_run="c", depth=depth)
    event = decide(given(opened()), command).event
    assert isinstance(event, ChildAdmitted if admitted else ChildRefused)
    if isinstance(event, ChildRefused):
        assert (event.reason, event.max_depth) == ("depth_limit", 2)


@pytest.mark.parametrize(
    ("command", "complaint"),
    [
        (Grant(request_id="r 1", tree="t1", run="root"), "invalid request id 'r 1'"),
        (Grant(request_id="r1", tree="a.b", run="root"), "invalid tree id 'a.b'"),
        (Grant(request_id="r1", tree="t1", run="root", calls=0), "invalid calls 0"),
        (Grant(request_id="r1", tree="t1", run="root", calls=-3), "invalid calls -3"),
        (
            RecordUsage(request_id="u1", tree="t1", run="r", prompt_tokens=-1),
            "invalid prompt_tokens -1",
        ),
        (RecordUsage(request_id="u1", tree="t1", run="r", cost=float("nan")), "invalid cost nan"),
        (
            OpenTree(request_id="o1", tenant="a/b", tree="t1", max_llm_calls=1),
            "invalid tenant id",
        ),
        (OpenTree(request_id="o1", tenant="a", tree="t1", max_llm_calls=-1), "max_llm_calls -1"),
        (
            OpenTree(request_id="o1", tenant="a", tree="t1", max_llm_calls=1, max_cost=0.0),
            "invalid max_cost 0.0",
        ),
        (
            AdmitChild(request_id="a1", tree="t1", parent_run="p", child_run="c", depth=0),
            "invalid depth 0",
        ),
    ],
)
def test_malformed_requests_name_the_field_the_value_and_the_rule(
    command: OpenTree | Grant | RecordUsage | AdmitChild, complaint: str
) -> None:
    with pytest.raises(Malformed, match=re.escape(complaint)):
        validate(command)


def test_refusals_are_counted_and_every_decision_is_indexed_by_its_request_id() -> None:
    state = given(opened(calls=1))
    for request_id in ("r1", "r2"):
        evolve(state, request_id, decide(state, grant(request_id)).event)
    assert (state.granted, state.refusals) == (1, 1)
    assert set(state.decisions) >= {"r1", "r2"}


def test_a_tenant_day_charges_calls_until_its_cap_and_then_refuses_with_what_is_left() -> None:
    caps = TenantCaps(calls_per_day=5)
    day = TenantDayState()
    first = charge_tenant(day, "r1", "t1", 4, caps, "2026-11-30")
    assert first.event == TenantCharged(tree="t1", calls=4)
    evolve_tenant(day, "r1", first.event)
    refused = charge_tenant(day, "r2", "t1", 2, caps, "2026-11-30").event
    assert isinstance(refused, TenantRefused)
    assert (refused.reason, refused.remaining_calls) == ("tenant_calls_exhausted", 1)
    assert charge_tenant(day, "r1", "t1", 4, caps, "2026-11-30") == Decision(first.event, False)


def test_a_tenant_day_refuses_once_its_recorded_cost_reaches_the_cap() -> None:
    day = TenantDayState()
    evolve_tenant(day, "u1", TenantCharged(tree="t1", cost=2.0))
    refused = charge_tenant(day, "r1", "t1", 1, TenantCaps(cost_per_day=2.0), "d").event
    assert isinstance(refused, TenantRefused)
    assert refused.reason == "tenant_cost_exhausted"


def test_a_released_charge_gives_its_calls_back_to_the_tenant_day() -> None:
    caps = TenantCaps(calls_per_day=5)
    day = TenantDayState()
    evolve_tenant(day, "r1:tenant", TenantCharged(tree="t1", calls=5))
    assert isinstance(charge_tenant(day, "r2", "t2", 2, caps, "d").event, TenantRefused)

    evolve_tenant(day, "r1:released", TenantReleased(tree="t1", charge="r1:tenant", calls=3))

    assert day.calls == 2
    assert charge_tenant(day, "r3", "t2", 3, caps, "d").event == TenantCharged(tree="t2", calls=3)
    refused = charge_tenant(day, "r4", "t2", 4, caps, "d").event
    assert isinstance(refused, TenantRefused)
    assert refused.remaining_calls == 3
    assert isinstance(day.decisions["r1:released"], TenantReleased)
