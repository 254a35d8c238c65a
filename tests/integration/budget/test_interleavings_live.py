"""Random interleavings on the real ledger: three in-process replicas, one JetStream server.

The pure model in tests/unit/budget/test_interleavings.py explores many more orders; this one
runs the service's own code (caches, group commits, lost races, catch-ups) on the real store.
"""

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_budget.config import BudgetSettings
from fleet_budget.domain import TreeState, evolve
from fleet_budget.handlers import Budget
from fleet_events import Actor, new_id, streams
from fleet_events.budget import (
    CloseTree,
    GetStatus,
    Grant,
    GrantReply,
    OpenTree,
    RecordUsage,
    TreeStatus,
    tree_subject,
)
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

LIMIT = 25

steps = st.lists(
    st.tuples(
        st.integers(0, 2),  # replica
        st.sampled_from(["grant", "grant", "grant", "usage", "close", "retry"]),
        st.integers(1, 5),  # size, or which earlier request a retry repeats
    ),
    min_size=1,
    max_size=40,
)


async def run_script(url: str, script: list[tuple[int, str, int]]) -> None:
    nc = await connect(url, name="interleavings")
    try:
        store = await open_store(nc.jetstream(), streams.BUDGET)
        replicas = [
            Budget(store, Actor(service="budget", replica=f"r{i}"), BudgetSettings())
            for i in range(3)
        ]
        tree = new_id()
        opened = OpenTree(request_id=new_id(), tenant="acme", tree=tree, max_llm_calls=LIMIT)
        await replicas[0].open(opened)
        sent: list[Grant | RecordUsage | CloseTree] = []
        owners: list[Budget] = []
        for who, kind, size in script:
            if kind == "retry":
                if not sent:
                    continue
                sent.append(sent[size % len(sent)])  # the same request, maybe to another replica
            elif kind == "usage":
                sent.append(RecordUsage(request_id=new_id(), tree=tree, run="r", cost=0.01 * size))
            elif kind == "close":
                sent.append(CloseTree(request_id=new_id(), tree=tree))
            else:
                sent.append(Grant(request_id=new_id(), tree=tree, run="r", calls=size))
            owners.append(replicas[who])

        async def send(budget: Budget, request: Grant | RecordUsage | CloseTree) -> object:
            if isinstance(request, Grant):
                return await budget.grant(request)
            if isinstance(request, RecordUsage):
                return await budget.record_usage(request)
            return await budget.close(request)

        replies = await asyncio.gather(*(send(b, r) for b, r in zip(owners, sent, strict=True)))

        first: dict[str, GrantReply] = {}
        for request, reply in zip(sent, replies, strict=True):
            if isinstance(reply, GrantReply):
                assert first.setdefault(request.request_id, reply) == reply
        state = TreeState()
        async for stored in store.replay(tree_subject(tree)):
            evolve(state, stored.envelope.id, stored.envelope.data)
        assert state.granted <= LIMIT
        assert state.granted == sum(r.calls for r in first.values() if r.granted)
        views: list[TreeStatus] = [await b.status(GetStatus(tree=tree)) for b in replicas]
        assert all(view == views[0] for view in views)  # every replica folds the same ledger
        assert (views[0].granted, views[0].refusals) == (state.granted, state.refusals)
    finally:
        await nc.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=steps)
def test_concurrent_interleavings_on_real_replicas_keep_every_invariant(
    nats_server: NatsServer, js: object, script: list[tuple[int, str, int]]
) -> None:
    asyncio.run(run_script(nats_server.url, script))
