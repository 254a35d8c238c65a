"""The depth-3, fan-out-4 tree (84 child runs) on ONE agent replica with 2 child slots, under
the default `auto` isolation policy: every child's sandbox a fork of its parent's, so the whole
tree is one fork family of 85 members on one uid. It died before at the family's process limit
(one sandbox's `nproc` for every member: "the sandbox process exited"); the local provider
now sizes a fork-ready sandbox's limit for its family (docs/sandboxes.md, "Fork families").

The test counts the policy's decisions by branch, on every parent's sandbox, and checks the
tree's sandboxes are all reaped at the end. Real broker, budget and agent processes, real
sandboxes, the scripted LM (a FAKE model server)."""

import pytest

from fleet_events import Event, bus, streams
from fleet_events.bus import Ping
from fleet_events.run import ChildRunCompleted, RunStarted
from fleet_events.sandbox import ChildIsolationDecided, SandboxDeleted, tenant_filter
from fleet_events.session import TurnCompleted
from fleet_harness.scripted_lm import ScriptedLM
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.store import EventStore

from .rlm_kit import Processes, Session, of_type, processes, session
from .test_children_tree import DEPTH, FAN_OUT, tree_script

__all__ = ["processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "1",
    "FLEET_ENGINE_CHILD_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "3",
    "FLEET_ENGINE_MAX_DEPTH": "3",
    "FLEET_ENGINE_MAX_LLM_CALLS": "10",
}
# the broker's defaults: each fork is its own sandbox, so a waiting parent's one host call
# is the only one in flight on its sandbox (the cap of 8 per sandbox does not bite)
BROKER_ENV: dict[str, str] = {}
CHILDREN = sum(FAN_OUT**d for d in range(1, DEPTH + 1))


async def tenant_sandbox_events(s: Session) -> list[tuple[str, Event]]:
    """(sandbox id, event) for every sandbox event of the session's tenant."""
    store = EventStore(s.nc.jetstream(), streams.SANDBOXES, s.codec)
    return [
        (stored.subject.rsplit(".", 1)[1], stored.envelope.data)
        async for stored in store.replay(tenant_filter(s.tenant))
    ]


async def test_a_depth_3_fan_out_4_tree_of_forks_runs_on_one_replica_with_two_slots(
    processes: Processes,
) -> None:
    with ScriptedLM(tree_script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("ROOT: count the leaves")
            ended = await s.ended(turn, timeout=180)
            events = await s.run_events(turn)
            (started,) = of_type(events, RunStarted)
            everything = await tenant_sandbox_events(s)
            decided = [e for _, e in everything if isinstance(e, ChildIsolationDecided)]
            children = {d.child for d in decided}

            async def all_reaped() -> bool:
                events = await tenant_sandbox_events(s)
                gone = {box for box, e in events if isinstance(e, SandboxDeleted)}
                return children <= gone

            await eventually(all_reaped, timeout=60, what="every child sandbox deleted")
            pong = await rpc.call_verb(s.nc, bus.ping("agent"), Ping(), timeout=5)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == str(FAN_OUT**DEPTH)
    assert len(of_type(events, ChildRunCompleted)) == FAN_OUT
    branches = {b: sum(1 for d in decided if d.branch == b) for b in {d.branch for d in decided}}
    assert branches == {"fork": CHILDREN}  # no clean fallback, no context: all 84 forked
    # the root's own decisions are on the session's sandbox; the rest on their parents'
    assert sum(1 for d in decided if d.parent == started.sandbox) == FAN_OUT
    assert len({d.parent for d in decided}) == 1 + FAN_OUT + FAN_OUT**2
    inner = {f"depth-{d}": 2 * FAN_OUT**d for d in range(1, DEPTH)}
    assert fake.calls == {"root": 2, **inner, "leaf": FAN_OUT**DEPTH}
    details = pong.details
    assert details["children_busy_peak"] <= 2
    assert details["children_handled"] == CHILDREN
    assert details["child_slots_lent"] == 0
