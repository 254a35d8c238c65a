"""A turn sent over the WebSocket keeps running while its client is away, and the client that
comes back with its last sequence reads the rest of it, nothing twice (the earlier system
cancelled the turn on disconnect and re-ran it on reconnect). A real agent replica runs the
turn (the scripted fake's `[hold:NAME]` barrier parks it while the socket is gone)."""

import json
from pathlib import Path

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from fleet_events import bus as verbs
from fleet_events import new_id, streams
from fleet_events.bus import Ping
from fleet_events.session import session_filter
from fleet_harness.procs import Launcher
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

from .ws_kit import frames_until, seqs, serve

pytestmark = pytest.mark.slow


async def test_a_dropped_socket_does_not_cancel_its_turn_and_a_resume_misses_nothing(
    private_nats: NatsServer, tmp_path: Path
) -> None:
    nc = await connect(private_nats.url, name="test")  # a server of its own: agent consumers
    js = nc.jetstream()
    await bootstrap(js, env={})
    barriers = tmp_path / "barriers"
    barriers.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    launcher = Launcher(nats_url=private_nats.url, log_dir=logs)
    try:
        launcher.start("agent", env={
            "FLEET_AGENT_RUNNER": "scripted", "FLEET_AGENT_BARRIER_DIR": str(barriers),
            "FLEET_AGENT_TURN_SLOTS": "1",
        })  # fmt: skip

        async def agent_up() -> bool:
            try:
                await rpc.call_verb(nc, verbs.ping("agent"), Ping(), timeout=0.5)
            except (NatsTimeout, NoRespondersError, TimeoutError):
                return False
            return True

        await eventually(agent_up, timeout=60, what="the agent to answer ping")
        tenant, session = f"t{new_id()[:8]}", new_id()
        async with serve(private_nats.url, tmp_path / "gw") as gw:
            ws = await gw.socket(tenant)
            await ws.send(json.dumps({"type": "message", "session_id": session,
                                      "content": "hello [hold:away] world"}))  # fmt: skip

            def kinds(frames: list[dict[str, object]]) -> list[str]:
                return [f["event"]["data"]["type"] for f in frames if f["type"] == "event"]  # type: ignore[index]

            before = await frames_until(ws, lambda f: "turn.started" in kinds(f))
            await eventually(lambda: (barriers / "away.reached.1").exists(), timeout=30,
                             what="the turn to reach its barrier")  # fmt: skip
            await ws.close()  # the client goes away mid-turn
            (barriers / "away").write_text("go")
            store = await open_store(js, streams.SESSIONS)

            async def ended() -> list[str] | None:
                types = [r.headers.get("Fleet-Type", "") async for r in
                         store.read_raw(session_filter(tenant, session))]  # fmt: skip
                return types if "turn.completed" in types else None

            types = await eventually(ended, timeout=30, what="the turn to complete")
            assert "turn.cancelled" not in types
            assert "turn.cancel_requested" not in types
            last = seqs(before)[-1]
            back = await gw.socket(tenant, "/api/v1/ws/execution/events", session_id=session,
                                   after_seq=last)  # fmt: skip
            after = await frames_until(back, lambda f: "turn.completed" in kinds(f))
            await back.close()
        stored = [r.seq async for r in store.read_raw(session_filter(tenant, session))]
        assert seqs(before) + seqs(after) == stored  # every event once, in order
        completed = next(f for f in after if f["type"] == "event"
                         and f["event"]["data"]["type"] == "turn.completed")  # fmt: skip
        assert completed["event"]["data"]["answer"] == "hello world"
    finally:
        launcher.stop_all()
        await nc.close()
