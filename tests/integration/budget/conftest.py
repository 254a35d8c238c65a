"""Budget tests: an in-process `Budget` on the real store, and a bus client with the retry rule."""

from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext

from fleet_budget.config import BudgetSettings
from fleet_budget.domain import TreeState, evolve
from fleet_budget.handlers import Budget
from fleet_events import Actor, new_id, streams
from fleet_events import bus as verbs
from fleet_events.budget import (
    ATTEMPT_TIMEOUT_S,
    CLIENT_DEADLINE_S,
    RETRYABLE_CODES,
    OpenReply,
    OpenTree,
    tree_subject,
)
from fleet_events.bus import Ping
from fleet_harness.procs import Launcher, Replica
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.store import EventStore, StoredEvent, open_store

Rep = TypeVar("Rep")
ACTOR = Actor(service="budget", replica="test-0")


@pytest.fixture
async def store(js: JetStreamContext) -> EventStore:
    return await open_store(js, streams.BUDGET)


@pytest.fixture
def budget(store: EventStore, nc: Client) -> Budget:
    return Budget(store, ACTOR, BudgetSettings())


def tenant() -> str:
    """A tenant of its own per test: the session's server is shared and days accumulate."""
    return f"tenant-{new_id()[:12]}"


BUDGET_VERBS = {v.name: v for v in verbs.verbs_of("budget")}


async def call(
    nc: Client,
    verb: str,
    request: Any,
    reply_type: type[Rep],
    *,
    attempt_timeout: float = ATTEMPT_TIMEOUT_S,
    deadline: float = CLIENT_DEADLINE_S,
    on_retry: Callable[[str], object] = lambda _: None,
) -> Rep:
    """The client rule of docs/budget.md: resend the same request until a final answer."""
    request_id = getattr(request, "request_id", "")
    catalogued = BUDGET_VERBS[verb]
    assert catalogued.reply is reply_type, f"{verb} answers {catalogued.reply.__name__}"
    reply: Rep = await rpc.call_verb_retrying(
        nc,
        catalogued,
        request,
        attempt_timeout=attempt_timeout,
        deadline=deadline,
        retry_codes=RETRYABLE_CODES,
        on_retry=lambda _attempt: on_retry(request_id),
    )
    return reply


async def open_tree(nc: Client, max_llm_calls: int, **limits: Any) -> str:
    tree = new_id()
    reply = await call(
        nc,
        "open",
        OpenTree(
            request_id=new_id(),
            tenant=limits.pop("tenant", "acme"),
            tree=tree,
            max_llm_calls=max_llm_calls,
            **limits,
        ),
        OpenReply,
    )
    assert reply.opened
    return tree


async def ledger(store: EventStore, tree: str) -> list[StoredEvent]:
    return [event async for event in store.replay(tree_subject(tree))]


def replayed(events: list[StoredEvent]) -> TreeState:
    state = TreeState()
    for stored in events:
        evolve(state, stored.envelope.id, stored.envelope.data)
    return state


async def wait_ready(nc: Client, replicas: list[Replica]) -> None:
    """Every replica has finished setup: ping is answered before setup runs, so readiness is the
    `concurrency` detail that setup sets last, after its subscriptions."""
    wanted = {r.env["FLEET_REPLICA"] for r in replicas}
    seen: set[str] = set()

    async def all_seen() -> bool:
        try:
            pong = await rpc.call_verb(nc, verbs.ping("budget"), Ping(), timeout=0.5)
        except (NatsTimeout, NoRespondersError):
            return False
        if "concurrency" in pong.details:
            seen.add(pong.replica)
        return wanted <= seen

    await eventually(all_seen, timeout=30, interval=0.0, what=f"replicas {sorted(wanted)}")


@pytest.fixture
async def replicas(nc: Client, js: JetStreamContext, launcher: Launcher) -> list[Replica]:
    """Three budget processes (after `js` has bootstrapped the streams they need)."""
    started = launcher.start("budget", count=3)
    await wait_ready(nc, started)
    return started
