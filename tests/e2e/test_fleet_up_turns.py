"""The issue's "done when", end to end: with `fleet up` running, a turn appended to a session's
log (no gateway call: the test appends `TurnRequested` itself) is dispatched, run by the agent
(the echo runner, set by the e2e fixture; the chat agent: test_fleet_up_chat.py) and ended,
every step in the log."""

import pytest

from fleet_events import Actor, Envelope, bus, new_id, streams, utc_now
from fleet_events.bus import Ping
from fleet_events.session import TurnCompleted, TurnRequested, log_subject
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.connection import connect
from fleet_mesh.store import open_store

from .conftest import StartMesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


async def test_a_turn_appended_under_fleet_up_completes_with_every_step_in_the_log(
    start_mesh: StartMesh,
) -> None:
    mesh = start_mesh()

    async def nats_url() -> str | None:
        assert mesh.process.poll() is None, mesh.printed()[-3000:]
        try:
            return str(mesh.state()["nats"])
        except (FileNotFoundError, KeyError, ValueError):
            return None

    nc = await connect(await eventually(nats_url, timeout=60, what="fleet up's NATS"), name="t")
    try:

        async def agent_up() -> bool:
            try:
                await rpc.call_verb(nc, bus.ping("agent"), Ping(), timeout=0.5)
            except Exception:
                return False
            return True

        await eventually(agent_up, timeout=90, interval=0.2, what="the agent to answer ping")
        store = await open_store(nc.jetstream(), streams.SESSIONS)
        tenant, session, turn = "e2e", f"s-{new_id()[:8]}", new_id()
        envelope = Envelope(
            id=new_id(), tenant=tenant, session=session, turn=turn,
            actor=Actor(service="gateway", replica="e2e"), ts=utc_now(),
            data=TurnRequested(message="hello from the log"),
        )  # fmt: skip
        await store.append(log_subject(tenant, session), envelope)

        async def kinds() -> list[str] | None:
            seen = [
                type(e.envelope.data).__name__
                async for e in store.replay(log_subject(tenant, session))
            ]
            return seen if "TurnCompleted" in seen else None

        assert await eventually(kinds, timeout=30, what="the turn to complete") == [
            "TurnRequested", "TurnStarted", "TurnCompleted",
        ]  # fmt: skip
        last = await store.last(log_subject(tenant, session))
        assert last is not None
        assert last.envelope.data == TurnCompleted(answer="hello from the log")
    finally:
        await nc.close()
