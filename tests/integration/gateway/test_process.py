"""The gateway as a real process on the common service runtime: HTTP on its port, ping on the
bus, the bus document beside the OpenAPI, a clean exit on SIGTERM."""

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
from nats.aio.client import Client

from fleet_events import bus as verbs
from fleet_events.bus import Ping
from fleet_harness.procs import Launcher, base_env
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.natsserver import NatsServer, free_port


def json_lines(text: str) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in text.splitlines() if line.startswith("{")]


def messages(text: str) -> list[str]:
    return [str(line["msg"]) for line in json_lines(text)]


async def test_gateway_process_serves_health_answers_ping_and_stops_on_sigterm(
    nc: Client, launcher: Launcher
) -> None:
    port = free_port()
    (replica,) = launcher.start("gateway", env={"FLEET_GATEWAY_PORT": str(port)})

    async def health() -> bool:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200

    await eventually(health, timeout=30, what="gateway /health")
    # HTTP listens before the runtime serves ping ("listening" < "started" below): ask until
    # the ping is served rather than once, the instant /health answers
    pong = await eventually(
        lambda: rpc.call_verb(nc, verbs.ping("gateway"), Ping(), timeout=2),
        timeout=30, what="the gateway's ping",
    )  # fmt: skip
    assert pong.pid == replica.pid
    assert pong.replica == "gateway-0"
    assert replica.stop() == 0
    said = messages(replica.logs())
    # The common runtime's life, with HTTP inside it: listening before ping is served
    # ("started"), and on SIGTERM the runtime stops first, uvicorn's shutdown running in its
    # stop hook. (The gateway that ran uvicorn outside, with the bus in its lifespan, logged
    # none of the runtime's lines and shut HTTP down before closing NATS on its own.)
    assert said.index("connecting") < said.index("listening") < said.index("started")
    assert said.index("started") < said.index("stopping") < said.index("Shutting down")
    assert said[-1] == "stopped"
    assert all(line["service"] == "gateway" for line in json_lines(replica.logs()))


async def test_gateway_serves_the_bus_document_beside_its_openapi(launcher: Launcher) -> None:
    port = free_port()
    launcher.start("gateway", env={"FLEET_GATEWAY_PORT": str(port)})

    async def document() -> httpx.Response | None:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/asyncapi.json")
        return response if response.status_code == 200 else None

    body = (await eventually(document, timeout=30, what="gateway /asyncapi.json")).json()
    assert body["asyncapi"] == "3.0.0"
    addresses = {channel["address"] for channel in body["channels"].values()}
    assert verbs.CREATE_SANDBOX.pattern in addresses  # a broker verb, queue group
    assert verbs.EXECUTE.pattern in addresses  # a broker verb, per sandbox
    assert verbs.ping("gateway").subject() in addresses
    async with httpx.AsyncClient() as client:
        openapi = (await client.get(f"http://127.0.0.1:{port}/openapi.json")).json()
    assert "/asyncapi.json" in openapi["paths"]


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


def test_a_bad_gateway_setting_stops_it_with_one_line_naming_the_variable(
    nats_server: NatsServer,
) -> None:
    env = base_env(nats_server.url, "gateway-0", "gateway") | {"FLEET_GATEWAY_PORT": "http"}
    done = subprocess.run(
        [sys.executable, "-m", "fleet_gateway"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "gateway: bad setting: FLEET_GATEWAY_PORT: Input should be a valid integer, "
        "unable to parse string as an integer"
    ]


def test_a_gateway_whose_port_is_taken_says_so_and_exits_non_zero(nats_server: NatsServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = base_env(nats_server.url, "gateway-0", "gateway") | {"FLEET_GATEWAY_PORT": str(port)}
        done = subprocess.run(
            [sys.executable, "-m", "fleet_gateway"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode != 0
    said = messages(done.stderr)
    assert any("address already in use" in line for line in said), said
    # the runtime still ran its stop (the bus connection closed, not abandoned); a background
    # retry (this server is not bootstrapped) may log between the two
    assert said[-1] == "stopped"
    assert "stopping" in said[:-1]
