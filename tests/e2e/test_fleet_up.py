"""`fleet up` end to end: real NATS, real service processes, real signals."""

import asyncio
import os
import signal
import stat
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client

from fleet_cli.mesh import connect_recorded
from fleet_events import bus as verbs
from fleet_events import streams, subjects
from fleet_events.access import ROLES
from fleet_events.bus import Ping, Pong
from fleet_events.subjects import SERVICES
from fleet_harness.waits import WaitTimeout, eventually
from fleet_mesh import rpc
from fleet_mesh.connection import PermissionRefused, connect
from fleet_mesh.credentials import CREDENTIALS_DIR_ENV, CREDENTIALS_ENV, Credentials
from fleet_mesh.natsserver import NatsServer

from .conftest import Mesh, StartMesh, descendants, living, processes

pytestmark = pytest.mark.slow

READY_S = 90.0
COMPONENTS = 1 + len(streams.STREAMS) + len(streams.KV_BUCKETS) + len(streams.OBJECT_STORES)
COMPONENTS += len(subjects.SERVICES)


async def ready(mesh: Mesh) -> dict[str, dict[str, object]]:
    last: list[str] = ["nothing answered"]

    async def probe() -> httpx.Response | None:
        assert mesh.process.poll() is None, f"fleet up exited:\n{mesh.printed()}"
        response = await asyncio.to_thread(mesh.ready)  # with the operator's token, once made
        last[0] = f"{response.status_code} {response.text}"
        return response if response.status_code == 200 else None

    try:
        response = await eventually(probe, timeout=READY_S, interval=0.2, what="/ready 200")
    except WaitTimeout:
        pytest.fail(f"/ready never said 200; last answer: {last[0]}\n{mesh.printed()[-3000:]}")
    return {c["name"]: c for c in response.json()["components"]}


async def ping(nc: Client, service: str) -> Pong | None:
    try:
        return await rpc.call_verb(nc, verbs.ping(service), Ping(), timeout=0.5)
    except (TimeoutError, rpc.RemoteError):
        return None
    except Exception:  # no responders while the service restarts
        return None


async def test_fleet_up_from_a_clean_state_reaches_ready_with_every_component_up(
    start_mesh: StartMesh,
) -> None:
    mesh = start_mesh()
    components = await ready(mesh)
    assert len(components) == COMPONENTS
    assert {name: c["state"] for name, c in components.items() if c["state"] != "up"} == {}
    await eventually(
        lambda: f"fleet is ready: {mesh.gateway}" in mesh.printed(), timeout=10, what="URL"
    )
    conf = (mesh.data_dir / "nats" / "nats.conf").read_text()
    assert "sync_interval: always" in conf  # the local durability decision
    assert 'listen: "127.0.0.1:' in conf  # loopback only
    logs = mesh.data_dir / "logs"
    for name in (*subjects.SERVICES, "nats", "fleet-up"):
        assert (logs / f"{name}.log").stat().st_size > 0, name
    status = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "fleet_cli", "status", "--data-dir", str(mesh.data_dir)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(status.communicate(), 30)
    assert status.returncode == 0, out.decode()
    assert ": ready" in out.decode()
    # the detail an anonymous caller is not shown: fleet status sends the mesh's own token
    replicas = {str(c["replica"]) for c in components.values() if c.get("replica")}
    assert replicas
    assert [r for r in sorted(replicas) if r not in out.decode()] == [], out.decode()


async def test_sigterm_to_fleet_up_stops_everything_and_leaves_no_process_behind(
    start_mesh: StartMesh,
) -> None:
    mesh = start_mesh()
    await ready(mesh)
    tree = descendants(mesh.process.pid)
    groups = {p.pgid for p in living(tree, set())}
    assert len(tree) >= len(subjects.SERVICES) + 1  # five services and nats-server, at least
    mesh.process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(mesh.process.wait, 30) == 0
    assert living(tree, groups) == []
    assert not (mesh.data_dir / "up.json").exists()
    assert "fleet stopped" in mesh.printed()


async def test_a_service_killed_with_sigkill_is_restarted_and_answers_again(
    start_mesh: StartMesh,
) -> None:
    mesh = start_mesh()
    await ready(mesh)
    nc = await connect(str(mesh.state()["nats"]), name="test")
    try:
        before = await eventually(lambda: ping(nc, "agent"), timeout=10, what="agent ping")
        os.kill(before.pid, signal.SIGKILL)

        async def new_agent() -> Pong | None:
            pong = await ping(nc, "agent")
            return pong if pong is not None and pong.pid != before.pid else None

        after = await eventually(new_agent, timeout=30, what="a restarted agent to answer")
    finally:
        await nc.close()
    assert after.replica != before.replica
    assert after.pid in descendants(mesh.process.pid)
    await eventually(lambda: "agent exited with -9" in mesh.printed(), timeout=10, what="log")
    await ready(mesh)


async def test_ready_reports_a_hung_service_as_down_with_503(start_mesh: StartMesh) -> None:
    mesh = start_mesh()
    await ready(mesh)
    nc = await connect(str(mesh.state()["nats"]), name="test")
    try:
        quality = await eventually(lambda: ping(nc, "quality"), timeout=10, what="quality ping")
    finally:
        await nc.close()
    os.kill(quality.pid, signal.SIGSTOP)  # alive to the supervisor, silent on the bus

    async def quality_alone_down() -> httpx.Response | None:
        """Each probe has the gateway's 0.5 s deadline: on a loaded machine a live service can
        miss it once, so one answer naming it too is load, not the hung service; the next one
        must name quality alone."""
        response = await asyncio.to_thread(mesh.ready)
        down = [c["name"] for c in response.json()["components"] if c["state"] == "down"]
        return response if down == ["quality"] else None

    try:
        response = await eventually(
            quality_alone_down, timeout=30, what="/ready naming quality alone as down"
        )
        assert response.status_code == 503
        components = {c["name"]: c for c in response.json()["components"]}
        assert "no answer within" in components["quality"]["detail"]
    finally:
        os.kill(quality.pid, signal.SIGCONT)
    await ready(mesh)


async def test_with_nats_url_set_fleet_up_joins_that_server_instead_of_starting_one(
    start_mesh: StartMesh, nats_server: NatsServer
) -> None:
    mesh = start_mesh(env={"NATS_URL": nats_server.url})
    components = await ready(mesh)
    assert mesh.state()["nats"] == nats_server.url
    assert str(nats_server.port) in str(components["nats"]["detail"])
    assert not (mesh.data_dir / "nats").exists()
    assert nats_server.process is not None
    assert nats_server.process.pid not in descendants(mesh.process.pid)


async def test_if_fleet_up_itself_is_sigkilled_every_child_is_still_told_to_stop(
    start_mesh: StartMesh,
) -> None:
    """The parent-death signal (SIGTERM) reaches each of fleet up's own children, and each
    exits although NATS vanishes at the same moment (a service's stop phases are bounded)."""
    mesh = start_mesh()
    await ready(mesh)
    children = {p.pid for p in processes().values() if p.ppid == mesh.process.pid}
    assert len(children) == len(subjects.SERVICES) + 1
    mesh.process.kill()  # no chance to clean up: only the kernel's parent-death signal is left
    await asyncio.to_thread(mesh.process.wait, 10)
    logs = mesh.data_dir / "logs"
    began_to_stop = {
        "nats": "Initiating Shutdown",
        "gateway": '"msg": "Shutting down"',
        **{service: '"msg": "stopping"' for service in subjects.SERVICES if service != "gateway"},
    }

    def told() -> list[str]:
        return [n for n, line in began_to_stop.items() if line in (logs / f"{n}.log").read_text()]

    await eventually(lambda: len(told()) == len(began_to_stop), timeout=30, what="every stop")
    # Every phase of a service's stop is bounded (fleet_mesh.service), NATS gone or not.
    await eventually(lambda: living(children, set()) == [], timeout=40, what="children gone")


async def test_a_nats_server_killed_under_fleet_up_is_restarted_and_the_mesh_recovers(
    start_mesh: StartMesh,
) -> None:
    mesh = start_mesh()
    await ready(mesh)
    nats = [p for p in living(descendants(mesh.process.pid), set()) if _is_nats(p.pid)]
    assert len(nats) == 1
    os.kill(nats[0].pid, signal.SIGKILL)
    await eventually(lambda: "nats exited with -9" in mesh.printed(), timeout=10, what="log")
    components = await ready(mesh)
    assert components["nats"]["state"] == "up"


def _is_nats(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except FileNotFoundError:
        return False
    return argv0.endswith(b"/nats-server")


async def test_fleet_up_makes_its_own_nats_users_and_never_shows_a_seed(
    start_mesh: StartMesh,
) -> None:
    # outside the suite (no credentials directory given), fleet up makes its own users
    mesh = start_mesh(env={CREDENTIALS_DIR_ENV: "", CREDENTIALS_ENV: ""})
    await ready(mesh)
    directory = mesh.data_dir / "credentials"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    seeds = {p.name: p.read_text().strip() for p in directory.iterdir()}
    assert set(seeds) == {f"{role}.nk" for role in ROLES}
    for name in seeds:
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name
    conf = (mesh.data_dir / "nats" / "nats.conf").read_text()
    credentials = Credentials(directory)
    for role in ROLES:
        assert credentials.public_key(role) in conf
    state = mesh.state()
    assert state["admin"] == str(directory / "admin.nk")  # a path, never the seed
    nc = await connect_recorded(state, name="e2e-admin")
    try:
        for service in SERVICES:  # each service connected as its own user, and serves
            pong = await eventually(partial(ping, nc, service), timeout=20, what=service)
            assert pong.service == service
    finally:
        await nc.close()
    # the suite's own admin is no user of this mesh
    with pytest.raises(PermissionRefused, match="not one of its users"):
        await asyncio.wait_for(connect(str(state["nats"]), name="e2e-stranger"), 20)
    shown = mesh.printed() + "".join(
        p.read_text(errors="replace") for p in (mesh.data_dir / "logs").glob("*.log")
    )
    assert [name for name, seed in seeds.items() if seed in shown] == []
