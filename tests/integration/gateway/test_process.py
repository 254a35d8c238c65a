"""The gateway as a real process: HTTP on its port, ping on the bus, clean exit on SIGTERM."""

import asyncio
from pathlib import Path

import httpx
from nats.aio.client import Client

from fleet_events import bus as verbs
from fleet_events.bus import Ping
from fleet_harness.procs import Launcher
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.natsserver import NatsServer, free_port


async def test_gateway_process_serves_health_answers_ping_and_stops_on_sigterm(
    nc: Client, launcher: Launcher
) -> None:
    port = free_port()
    (replica,) = launcher.start("gateway", env={"FLEET_GATEWAY_PORT": str(port)})

    async def health() -> bool:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200

    await eventually(health, timeout=30, what="gateway /health")
    pong = await rpc.call_verb(nc, verbs.ping("gateway"), Ping(), timeout=2)
    assert pong.pid == replica.pid
    assert pong.replica == "gateway-0"
    assert replica.stop() == 0
    assert '"msg": "listening"' in replica.logs()


async def test_gateway_stops_promptly_on_sigterm_when_nats_is_already_gone(
    private_nats: NatsServer, tmp_path: Path
) -> None:
    launcher = Launcher(nats_url=private_nats.url, log_dir=tmp_path)
    port = free_port()
    try:
        (replica,) = launcher.start("gateway", env={"FLEET_GATEWAY_PORT": str(port)})

        async def health() -> bool:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200

        await eventually(health, timeout=30, what="gateway /health")
        private_nats.kill()
        # exits by itself within 15 s (a bounded close, not nats-py's 30 s drain); stop() would
        # SIGKILL it after that, and the exit code would say so
        assert await asyncio.to_thread(replica.stop, 15) == 0
    finally:
        launcher.stop_all()
