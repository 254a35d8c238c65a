"""Field by field: each decision's whole event, each validation bound at both of its edges, and
each message in full. A check that only looks at `granted` or at the exception's type lets a
dropped field or a wrong bound through (scripts/mutate found them)."""

import math
from typing import Any

import msgspec
import pytest

from fleet_budget.domain import (
    MAX_CALLS_PER_GRANT,
    MAX_REASON_CHARS,
    Decision,
    TenantCaps,
    TenantDayState,
    TreeState,
    charge_tenant,
    decide,
    evolve,
    evolve_tenant,
    refused_by_tenant,
    status,
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
    TreeClosed,
    TreeOpened,
    TreeStatus,
    UsageRecorded,
)
from fleet_events.envelope import Event

OPEN = OpenTree(request_id="o1", tenant="acme", tree="t1", max_llm_calls=10, max_depth=2)
GRANT = Grant(request_id="g1", tree="t1", run="root")
USAGE = RecordUsage(request_id="u1", tree="t1", run="root")
ADMIT = AdmitChild(request_id="a1", tree="t1", parent_run="root", child_run="c1", depth=1)
CLOSE = CloseTree(request_id="c1", tree="t1")


def state_of(*events: Event) -> TreeState:
    state = TreeState()
    for index, event in enumerate(events):
        evolve(state, f"e{index}", event)
    return state


def opened(**limits: Any) -> TreeState:
    return state_of(decide(TreeState(), msgspec.structs.replace(OPEN, **limits)).event)


def malformed(command: Any) -> str:
    with pytest.raises(Malformed) as caught:
        validate(command)
    return str(caught.value)


# --- validation --------------------------------------------------------------------------------

ID_FIELDS = [
    (OPEN, "request_id", "request"),
    (OPEN, "tenant", "tenant"),
    (OPEN, "tree", "tree"),
    (OPEN, "session", "session"),
    (OPEN, "turn", "turn"),
    (OPEN, "root_run", "root run"),
    (GRANT, "request_id", "request"),
    (GRANT, "tree", "tree"),
    (GRANT, "run", "run"),
    (USAGE, "request_id", "request"),
    (USAGE, "tree", "tree"),
    (USAGE, "run", "run"),
    (ADMIT, "request_id", "request"),
    (ADMIT, "tree", "tree"),
    (ADMIT, "parent_run", "parent run"),
    (ADMIT, "child_run", "child run"),
    (CLOSE, "request_id", "request"),
    (CLOSE, "tree", "tree"),
]


@pytest.mark.parametrize(("command", "field", "kind"), ID_FIELDS)
def test_every_id_is_checked_and_named_in_words(command: Any, field: str, kind: str) -> None:
    message = malformed(msgspec.structs.replace(command, **{field: "a.b"}))
    assert message.startswith(f"invalid {kind} id 'a.b': use 1-64 characters")


def test_an_unset_optional_id_does_not_stop_the_ids_after_it_being_checked() -> None:
    assert "invalid turn id" in malformed(msgspec.structs.replace(OPEN, session=None, turn="a.b"))


def _whole(name: str, value: object, bound: str) -> str:
    return f"invalid {name} {value!r}: it must be a whole number {bound}"


COUNTS = [
    # command, field, lowest valid, highest valid (None: no upper bound)
    (OPEN, "max_llm_calls", 0, None),
    (OPEN, "max_depth", 0, 64),
    (OPEN, "max_tokens", 1, None),
    (OPEN, "max_steps_per_run", 1, 10_000),
    (GRANT, "calls", 1, MAX_CALLS_PER_GRANT),
    (USAGE, "calls", 0, MAX_CALLS_PER_GRANT),
    (USAGE, "prompt_tokens", 0, None),
    (USAGE, "completion_tokens", 0, None),
    (ADMIT, "depth", 1, 65),
]


@pytest.mark.parametrize(("command", "field", "low", "high"), COUNTS)
def test_every_count_is_valid_exactly_within_its_bounds(
    command: Any, field: str, low: int, high: int | None
) -> None:
    bound = f"from {low} to {high}" if high is not None else f">= {low}"
    validate(msgspec.structs.replace(command, **{field: low}))
    assert malformed(msgspec.structs.replace(command, **{field: low - 1})) == _whole(
        field, low - 1, bound
    )
    assert malformed(msgspec.structs.replace(command, **{field: True})) == _whole(
        field, True, bound
    )
    if high is not None:
        validate(msgspec.structs.replace(command, **{field: high}))
        assert malformed(msgspec.structs.replace(command, **{field: high + 1})) == _whole(
            field, high + 1, bound
        )
    else:
        validate(msgspec.structs.replace(command, **{field: 10**12}))


def test_money_is_a_finite_amount_and_a_cost_cap_is_more_than_nothing() -> None:
    validate(msgspec.structs.replace(USAGE, cost=0.0))
    validate(msgspec.structs.replace(USAGE, cost=0.5))
    for bad in (-0.01, math.inf, math.nan):
        assert malformed(msgspec.structs.replace(USAGE, cost=bad)) == (
            f"invalid cost {bad!r}: it must be a finite number >= 0"
        )
    validate(msgspec.structs.replace(OPEN, max_cost=0.5))
    validate(msgspec.structs.replace(OPEN, max_cost=None))
    for bad in (0.0, -1.0, math.inf):
        assert malformed(msgspec.structs.replace(OPEN, max_cost=bad)) == (
            f"invalid max_cost {bad!r}: it must be a finite number > 0"
        )


def test_a_close_reason_is_kept_short() -> None:
    validate(msgspec.structs.replace(CLOSE, reason="x" * MAX_REASON_CHARS))
    long = "x" * (MAX_REASON_CHARS + 1)
    assert malformed(msgspec.structs.replace(CLOSE, reason=long)) == (
        f"close reason is {MAX_REASON_CHARS + 1} characters; keep it short"
    )


# --- decide ------------------------------------------------------------------------------------


def test_an_open_records_every_limit_and_the_day_it_charges() -> None:
    command = msgspec.structs.replace(OPEN, max_tokens=100, max_cost=2.5, root_run="root")
    assert decide(TreeState(), command, tenant_day="2026-11-30") == Decision(
        TreeOpened(
            tree="t1",
            tenant="acme",
            max_llm_calls=10,
            max_depth=2,
            max_tokens=100,
            max_cost=2.5,
            tenant_day="2026-11-30",
            root_run="root",
        ),
        new=True,
    )
    assert decide(TreeState(), OPEN).event == TreeOpened(
        tree="t1", tenant="acme", max_llm_calls=10, max_depth=2
    )  # no day given: none recorded
    again = decide(opened(), msgspec.structs.replace(OPEN, request_id="o2", tree="t1"))
    assert again == Decision(
        OpenRefused(
            tree="t1",
            reason="already_open",
            message="tree 't1' is already open with max_llm_calls=10; its first limits stand. "
            "Use a new tree id for a new turn",
        ),
        new=True,
    )


def test_a_command_on_an_unopened_tree_names_the_tree() -> None:
    with pytest.raises(UnknownTree, match=r"^unknown tree 't1': no tree with this id was opened"):
        decide(TreeState(), GRANT)


def test_grants_and_each_refusal_in_full() -> None:
    state = opened(max_tokens=100, max_cost=1.0)
    assert decide(state, msgspec.structs.replace(GRANT, calls=3)) == Decision(
        Granted(run="root", calls=3, granted_total=3, remaining=7), new=True
    )
    state.granted = 8
    assert decide(state, msgspec.structs.replace(GRANT, calls=3)).event == GrantRefused(
        run="root",
        calls=3,
        reason="calls_exhausted",
        remaining=2,
        message="budget spent: asked for 3 LLM call(s), 2 of 10 left",
    )
    state.tokens_used = 100
    assert decide(state, GRANT).event == GrantRefused(
        run="root",
        calls=1,
        reason="tokens_exhausted",
        remaining=2,
        message="budget spent: 100 of 100 tokens used",
    )
    state.tokens_used, state.cost_used = 0, 1.0
    assert decide(state, GRANT).event == GrantRefused(
        run="root",
        calls=1,
        reason="cost_exhausted",
        remaining=2,
        message="budget spent: cost 1.0000 of 1.0000",
    )
    state.closed = True
    assert decide(state, GRANT).event == GrantRefused(
        run="root",
        calls=1,
        reason="tree_closed",
        remaining=2,
        message="budget spent: tree 't1' is closed",
    )


def test_a_runs_steps_draw_on_its_own_allowance_and_each_refusal_is_in_full() -> None:
    state = opened(max_steps_per_run=3, max_tokens=100, max_cost=1.0)
    state.granted = 4
    step = Grant(request_id="s1", tree="t1", run="root", calls=3, kind="step")
    assert decide(state, step) == Decision(
        Granted(run="root", calls=3, granted_total=4, remaining=6, kind="step"), new=True
    )  # the whole allowance of a run that has used none; the tree's count is untouched
    evolve(state, "s1", decide(state, step).event)
    one_more = msgspec.structs.replace(step, request_id="s2", calls=1)
    assert decide(state, one_more).event == GrantRefused(
        run="root",
        calls=1,
        reason="calls_exhausted",
        remaining=6,
        message="budget spent: run 'root' asked for 1 step call(s) with 3 of its 3 used "
        "(max_iters plus the extract step)",
    )
    other_run = msgspec.structs.replace(one_more, run="child")
    state.tokens_used = 100
    assert decide(state, other_run).event == GrantRefused(
        run="child",
        calls=1,
        reason="tokens_exhausted",
        remaining=6,
        message="budget spent: 100 of 100 tokens used",
    )
    state.tokens_used, state.cost_used = 0, 1.0
    assert decide(state, other_run).event == GrantRefused(
        run="child",
        calls=1,
        reason="cost_exhausted",
        remaining=6,
        message="budget spent: cost 1.0000 of 1.0000",
    )


def test_usage_is_recorded_as_reported() -> None:
    usage = RecordUsage(
        request_id="u1",
        tree="t1",
        run="child",
        calls=2,
        prompt_tokens=11,
        completion_tokens=7,
        cost=0.25,
        model="m",
        role="sub",
    )
    assert decide(opened(), usage) == Decision(
        UsageRecorded(
            run="child",
            calls=2,
            prompt_tokens=11,
            completion_tokens=7,
            cost=0.25,
            model="m",
            role="sub",
        ),
        new=True,
    )


def test_children_and_closing_in_full() -> None:
    state = opened()
    assert decide(state, ADMIT) == Decision(
        ChildAdmitted(parent_run="root", child_run="c1", depth=1), new=True
    )
    deep = msgspec.structs.replace(ADMIT, depth=3)
    assert decide(state, deep).event == ChildRefused(
        parent_run="root",
        child_run="c1",
        depth=3,
        max_depth=2,
        reason="depth_limit",
        message="child run at depth 3 is over the tree's max_depth 2: answer this sub-task "
        "without sub_rlm",
    )
    closing = msgspec.structs.replace(CLOSE, reason="turn done")
    assert decide(state, closing) == Decision(TreeClosed(reason="turn done"), new=True)
    state.closed = True
    assert decide(state, ADMIT).event == ChildRefused(
        parent_run="root",
        child_run="c1",
        depth=1,
        max_depth=2,
        reason="tree_closed",
        message="tree 't1' is closed: no new child runs",
    )


def test_a_reused_request_id_names_what_it_answered() -> None:
    state = opened()
    evolve(state, "g1", decide(state, GRANT).event)
    with pytest.raises(Malformed) as caught:
        decide(state, msgspec.structs.replace(GRANT, calls=2))
    assert str(caught.value) == (
        "request_id 'g1' already answered a different request (Granted) on tree 't1': a retry "
        "must repeat the same request; a new request needs a new request_id"
    )


def test_a_tenant_refusal_is_recorded_on_the_tree_with_what_the_tree_has_left() -> None:
    state = opened()
    state.granted = 4
    refusal = TenantRefused(
        tree="t1", calls=2, reason="tenant_calls_exhausted", remaining_calls=1, message="cap"
    )
    assert refused_by_tenant(state, msgspec.structs.replace(GRANT, calls=2), refusal) == (
        GrantRefused(
            run="root",
            calls=2,
            reason="tenant_calls_exhausted",
            remaining=6,
            message="budget spent: cap",
        )
    )


# --- evolve and status ---------------------------------------------------------------------------


def test_the_fold_accumulates_usage_and_refusals_and_reports_them_in_status() -> None:
    state = state_of(
        TreeOpened(
            tree="t1",
            tenant="acme",
            max_llm_calls=10,
            max_depth=2,
            max_tokens=500,
            max_cost=3.0,
            tenant_day="2026-11-30",
        ),
        Granted(run="r", calls=4, granted_total=4, remaining=6),
        UsageRecorded(run="r", calls=2, prompt_tokens=10, completion_tokens=5, cost=0.5),
        UsageRecorded(run="r", calls=3, prompt_tokens=1, completion_tokens=2, cost=0.25),
        GrantRefused(run="r", calls=9, reason="calls_exhausted", remaining=6, message="m"),
        ChildRefused(
            parent_run="r", child_run="c", depth=3, max_depth=2, reason="depth_limit", message="m"
        ),
    )
    assert (state.tree, state.tenant, state.tenant_day) == ("t1", "acme", "2026-11-30")
    assert status(state, seq=42) == TreeStatus(
        tree="t1",
        tenant="acme",
        open=True,
        max_llm_calls=10,
        granted=4,
        remaining=6,
        max_depth=2,
        max_tokens=500,
        max_cost=3.0,
        tokens_used=18,
        cost_used=0.75,
        calls_recorded=5,
        refusals=2,
        seq=42,
        tree_calls=4,  # the grants of every kind (all sub calls here)
    )
    evolve(state, "close", TreeClosed())
    assert not status(state, seq=43).open
    assert not status(TreeState(), seq=0).open  # never opened: not open either


# --- a tenant's day ------------------------------------------------------------------------------


def test_a_tenant_day_accumulates_charges() -> None:
    day = TenantDayState()
    evolve_tenant(day, "a", TenantCharged(tree="t1", calls=2, cost=0.5))
    evolve_tenant(day, "b", TenantCharged(tree="t2", calls=3, cost=0.25))
    assert (day.calls, day.cost) == (5, 0.75)


def test_tenant_charges_and_refusals_in_full() -> None:
    caps = TenantCaps(calls_per_day=5, cost_per_day=1.0)
    day = TenantDayState(calls=3, cost=0.5)
    assert charge_tenant(day, "r1", "t1", 2, caps, "2026-11-30") == Decision(
        TenantCharged(tree="t1", calls=2), new=True
    )
    assert charge_tenant(day, "r1", "t1", 3, caps, "2026-11-30") == Decision(
        TenantRefused(
            tree="t1",
            calls=3,
            reason="tenant_calls_exhausted",
            remaining_calls=2,
            message="the tenant's daily cap of 5 LLM calls leaves 2 on 2026-11-30 UTC; asked for 3",
        ),
        new=True,
    )
    spent = TenantDayState(calls=6, cost=1.0)
    assert charge_tenant(spent, "r1", "t1", 1, caps, "2026-11-30") == Decision(
        TenantRefused(
            tree="t1",
            calls=1,
            reason="tenant_cost_exhausted",
            remaining_calls=0,  # more than the cap was charged (in-flight grants): none left
            message="the tenant's daily cost cap 1.0000 is reached (1.0000 spent on 2026-11-30 "
            "UTC)",
        ),
        new=True,
    )
    uncapped = TenantCaps(cost_per_day=1.0)
    refused = charge_tenant(spent, "r1", "t1", 1, uncapped, "d").event
    assert isinstance(refused, TenantRefused)
    assert refused.remaining_calls is None  # no call cap: nothing to count down
