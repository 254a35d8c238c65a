"""The budget's use cases on a real JetStream ledger, in one process."""

import asyncio

import pytest
from nats.aio.client import Client

from fleet_budget.config import BudgetSettings, TenantCapsSetting
from fleet_budget.errors import Malformed, UnknownTree
from fleet_budget.handlers import Budget
from fleet_events import new_id
from fleet_events.budget import (
    AdmitChild,
    CloseTree,
    GetStatus,
    Grant,
    Granted,
    GrantRefused,
    OpenTree,
    RecordUsage,
    TenantCharged,
    TenantReleased,
    tenant_day_subject,
)
from fleet_mesh.store import EventStore

from .conftest import ACTOR, ledger, replayed, tenant


async def opened(budget: Budget, calls: int, **limits: object) -> str:
    tree = new_id()
    command = OpenTree(
        request_id=new_id(),
        tenant=str(limits.pop("tenant", "acme")),
        tree=tree,
        max_llm_calls=calls,
        **limits,  # type: ignore[arg-type]
    )
    assert (await budget.open(command)).opened
    return tree


async def test_a_retried_grant_is_answered_from_the_ledger_by_another_replica(
    store: EventStore, nc: Client, budget: Budget
) -> None:
    tree = await opened(budget, 2)
    other = Budget(store, ACTOR, BudgetSettings())
    request = Grant(request_id=new_id(), tree=tree, run="root", calls=2)

    first = await budget.grant(request)
    retried = await other.grant(request)  # a replica that never saw the tree

    assert first.granted
    assert retried == first
    assert [type(e.envelope.data).__name__ for e in await ledger(store, tree)] == [
        "TreeOpened",
        "Granted",
    ]


async def test_two_replicas_racing_on_one_tree_never_over_grant(
    store: EventStore, nc: Client, budget: Budget
) -> None:
    tree = await opened(budget, 50)
    others = [Budget(store, ACTOR, BudgetSettings()) for _ in range(3)]
    requests = [Grant(request_id=new_id(), tree=tree, run="r", calls=1) for _ in range(80)]

    replies = await asyncio.gather(*(others[i % 3].grant(r) for i, r in enumerate(requests)))

    assert sum(r.granted for r in replies) == 50
    state = replayed(await ledger(store, tree))
    assert (state.granted, state.refusals) == (50, 30)


async def test_malformed_and_unknown_requests_store_nothing(
    store: EventStore, budget: Budget
) -> None:
    tree = await opened(budget, 5)
    with pytest.raises(Malformed, match="invalid calls -1"):
        await budget.grant(Grant(request_id=new_id(), tree=tree, run="root", calls=-1))
    with pytest.raises(UnknownTree, match="open it first"):
        await budget.grant(Grant(request_id=new_id(), tree=new_id(), run="root"))
    assert len(await ledger(store, tree)) == 1


async def test_usage_caps_and_status(budget: Budget) -> None:
    tree = await opened(budget, 10, max_tokens=100)
    assert (await budget.grant(Grant(request_id=new_id(), tree=tree, run="r"))).granted
    usage = RecordUsage(
        request_id=new_id(), tree=tree, run="r", prompt_tokens=90, completion_tokens=20, cost=0.01
    )
    assert (await budget.record_usage(usage)).tokens_used == 110
    assert (await budget.record_usage(usage)).tokens_used == 110  # a retry counts once
    refused = await budget.grant(Grant(request_id=new_id(), tree=tree, run="r"))
    assert (refused.granted, refused.reason) == (False, "tokens_exhausted")
    status = await budget.status(GetStatus(tree=tree))
    assert (status.granted, status.remaining, status.refusals) == (1, 9, 1)


async def test_depth_admission_at_the_limit(budget: Budget) -> None:
    tree = await opened(budget, 10, max_depth=2)

    def admit(depth: int) -> AdmitChild:
        return AdmitChild(
            request_id=new_id(), tree=tree, parent_run="p", child_run=new_id(), depth=depth
        )

    at_limit = await budget.admit(admit(2))
    over = await budget.admit(admit(3))
    assert at_limit.admitted
    assert (over.admitted, over.reason, over.max_depth) == (False, "depth_limit", 2)


async def test_a_closed_tree_refuses_grants(budget: Budget) -> None:
    tree = await opened(budget, 10)
    closed = await budget.close(CloseTree(request_id=new_id(), tree=tree, reason="done"))
    again = await budget.close(CloseTree(request_id=new_id(), tree=tree))
    assert not closed.open
    assert again.seq == closed.seq  # closing a closed tree stores nothing
    reply = await budget.grant(Grant(request_id=new_id(), tree=tree, run="r"))
    assert (reply.granted, reply.reason) == (False, "tree_closed")


async def test_tenant_daily_call_cap_holds_across_trees_and_replicas(
    store: EventStore, nc: Client
) -> None:
    who = tenant()
    settings = BudgetSettings(tenant_caps={who: TenantCapsSetting(calls_per_day=7)})
    replicas = [Budget(store, ACTOR, settings, today=lambda: "2026-11-30") for _ in range(3)]
    trees = [await opened(replicas[0], 5, tenant=who) for _ in range(3)]
    requests = [Grant(request_id=new_id(), tree=trees[i % 3], run="r") for i in range(12)]

    replies = await asyncio.gather(*(replicas[i % 3].grant(r) for i, r in enumerate(requests)))

    assert sum(r.granted for r in replies) == 7
    refused = [r for r in replies if not r.granted]
    assert {r.reason for r in refused} == {"tenant_calls_exhausted"}
    assert all("daily cap of 7 LLM calls" in r.message for r in refused)
    day = [e.envelope.data async for e in store.replay(tenant_day_subject(who, "2026-11-30"))]
    charged = sum(e.calls for e in day if isinstance(e, TenantCharged))
    released = sum(e.calls for e in day if isinstance(e, TenantReleased))
    assert charged - released == 7


async def test_a_charge_whose_tree_grant_is_refused_is_released_and_its_calls_reused(
    store: EventStore, nc: Client
) -> None:
    """The release path, made to happen: replica A's cache of the tree is stale, so A's preview
    says "grant", A charges the tenant, and only then learns from the ledger that B took the
    tree's last call. The charge must be handed back, and the handed-back call granted later."""
    who, day = tenant(), "2026-11-30"
    settings = BudgetSettings(tenant_caps={who: TenantCapsSetting(calls_per_day=2)})
    a, b = (Budget(store, ACTOR, settings, today=lambda: day) for _ in range(2))
    tree = await opened(a, 1, tenant=who)  # A has the tree cached: one call left

    assert (await b.grant(Grant(request_id=new_id(), tree=tree, run="r"))).granted
    late = await a.grant(Grant(request_id=new_id(), tree=tree, run="r"))

    assert (late.granted, late.reason) == (False, "calls_exhausted")
    facts = [e.envelope.data async for e in store.replay(tenant_day_subject(who, day))]
    assert [type(f).__name__ for f in facts] == ["TenantCharged", "TenantCharged", "TenantReleased"]
    released = facts[2]
    assert isinstance(released, TenantReleased)
    assert (released.tree, released.calls) == (tree, 1)
    # the cap is 2 and one call was given back: A (whose tenant-day fold saw the release) and a
    # fresh replica both grant the second call of the day, and then nothing more
    other_tree = await opened(a, 5, tenant=who)
    assert (await a.grant(Grant(request_id=new_id(), tree=other_tree, run="r"))).granted
    fresh = Budget(store, ACTOR, settings, today=lambda: day)
    over = await fresh.grant(Grant(request_id=new_id(), tree=other_tree, run="r"))
    assert (over.granted, over.reason) == (False, "tenant_calls_exhausted")


async def test_tenant_cost_cap_refuses_after_recorded_cost_reaches_it(
    store: EventStore, nc: Client
) -> None:
    who = tenant()
    settings = BudgetSettings(tenant_caps={who: TenantCapsSetting(cost_per_day=1.0)})
    budget = Budget(store, ACTOR, settings)
    tree = await opened(budget, 10, tenant=who)
    assert (await budget.grant(Grant(request_id=new_id(), tree=tree, run="r"))).granted
    await budget.record_usage(RecordUsage(request_id=new_id(), tree=tree, run="r", cost=1.0))
    other_tree = await opened(budget, 10, tenant=who)
    refused = await budget.grant(Grant(request_id=new_id(), tree=other_tree, run="r"))
    assert (refused.granted, refused.reason) == (False, "tenant_cost_exhausted")
    events = [e.envelope.data for e in await ledger(store, other_tree)]
    assert isinstance(events[-1], GrantRefused)
    assert not any(isinstance(e, Granted) for e in events)


async def test_a_request_id_reused_on_another_tree_is_rejected_not_silently_dropped(
    store: EventStore, budget: Budget
) -> None:
    first, second = await opened(budget, 5), await opened(budget, 5)
    request_id = new_id()
    assert (await budget.grant(Grant(request_id=request_id, tree=first, run="r"))).granted
    with pytest.raises(Malformed, match="already used for a request on another ledger"):
        await budget.grant(Grant(request_id=request_id, tree=second, run="r"))
    assert len(await ledger(store, second)) == 1


async def test_a_retry_queued_beside_its_original_in_one_group_commit_is_stored_once(
    store: EventStore, budget: Budget
) -> None:
    tree = await opened(budget, 100)
    twice = Grant(request_id=new_id(), tree=tree, run="r", calls=3)
    others = [Grant(request_id=new_id(), tree=tree, run="r") for _ in range(20)]

    replies = await asyncio.gather(
        *(budget.grant(g) for g in [*others[:10], twice, twice, *others[10:]])
    )

    assert replies[10] == replies[11]
    assert replayed(await ledger(store, tree)).granted == 23


async def test_a_foreign_request_id_in_a_group_commit_fails_alone(
    store: EventStore, budget: Budget
) -> None:
    first, second = await opened(budget, 5), await opened(budget, 50)
    reused = new_id()
    assert (await budget.grant(Grant(request_id=reused, tree=first, run="r"))).granted
    batch = [Grant(request_id=new_id(), tree=second, run="r") for _ in range(20)]
    batch.insert(7, Grant(request_id=reused, tree=second, run="r"))

    replies = await asyncio.gather(*(budget.grant(g) for g in batch), return_exceptions=True)

    failed = [r for r in replies if isinstance(r, BaseException)]
    assert len(failed) == 1
    assert isinstance(failed[0], Malformed)
    assert replayed(await ledger(store, second)).granted == 20
