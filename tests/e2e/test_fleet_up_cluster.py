"""`fleet up --cluster 3` (issue 24 item 1): three nats-server nodes routed on loopback, every
stream at three replicas, `fleet status` naming each node, the meta leader and each stream's
leader; a turn answered before and after its stream leader's node is SIGKILLed."""

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client

from fleet_cli.mesh import connect_recorded
from fleet_events import Actor, Envelope, new_id, streams, utc_now
from fleet_events.session import TurnRequested, log_subject
from fleet_harness.waits import eventually
from fleet_mesh.connection import PermissionRefused, connect
from fleet_mesh.store import EventStore, StoreError, open_store

from .conftest import Mesh, StartMesh, processes
from .test_fleet_up import ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NODES = 3
STORES = [s.name for s in streams.STREAMS]
STORES += [f"KV_{kv.bucket}" for kv in streams.KV_BUCKETS]
STORES += [f"OBJ_{obj.bucket}" for obj in streams.OBJECT_STORES]


def fleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


def node_pid(mesh: Mesh, name: str) -> int:
    index = name.rsplit("-", 1)[1]
    conf = str(mesh.data_dir / "nats" / f"node-{index}" / "nats.conf").encode()
    for pid in processes():
        try:
            if conf in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except FileNotFoundError:
            continue
    raise AssertionError(f"no process of {name}")


async def replicated(nc: Client) -> dict[str, str]:
    """Each store's leader, once every one has two current followers (else {})."""
    js = nc.jetstream()
    leaders = {}
    for name in STORES:
        try:
            info = await js.stream_info(name)
        except Exception:  # an election under way
            return {}
        cluster = info.cluster
        if cluster is None or cluster.leader is None:
            return {}
        followers = [r for r in cluster.replicas or [] if r.current and not r.offline]
        if info.config.num_replicas != NODES or len(followers) != NODES - 1:
            return {}
        leaders[name] = cluster.leader
    return leaders


async def turn_answered(store: EventStore, tenant: str, message: str) -> list[str]:
    session, turn = f"s-{new_id()[:8]}", new_id()
    envelope = Envelope(
        id=new_id(), tenant=tenant, session=session, turn=turn,
        actor=Actor(service="gateway", replica="e2e"), ts=utc_now(),
        data=TurnRequested(message=message),
    )  # fmt: skip
    subject = log_subject(tenant, session)

    async def appended() -> bool:
        try:
            await store.append(subject, envelope)  # the same id: a resend is deduplicated
        except (StoreError, TimeoutError):
            return False
        return True

    await eventually(appended, timeout=30, what="an acknowledged append")

    async def kinds() -> list[str] | None:
        seen = [type(e.envelope.data).__name__ async for e in store.replay(subject)]
        return seen if "TurnCompleted" in seen else None

    return await eventually(kinds, timeout=60, what=f"the turn {message!r} to complete")


async def test_a_three_node_cluster_serves_and_rides_through_its_stream_leaders_kill(
    start_mesh: StartMesh,
) -> None:
    mesh = start_mesh(args=("--cluster", str(NODES)))
    await ready(mesh)
    recorded = mesh.state()["cluster"]
    assert [n["name"] for n in recorded] == ["nats-0", "nats-1", "nats-2"]
    assert mesh.state()["nats"] == ",".join(n["url"] for n in recorded)
    status = fleet("status", "--data-dir", str(mesh.data_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    assert "nats cluster: meta leader nats-" in status.stdout
    assert status.stdout.count(" up ") >= NODES, status.stdout
    # every node speaks TLS only, clients and routes, from the mesh's own CA: a client that
    # trusts no CA is refused at once, naming what to set
    async with httpx.AsyncClient(timeout=10) as http:
        varzs = [(await http.get(f"{n['monitor']}/varz")).json() for n in recorded]
    for varz in varzs:
        assert varz["tls_required"] is True
        assert varz["cluster"]["tls_required"] is True
        assert varz["cluster"]["tls_verify"] is True
    with pytest.raises(PermissionRefused, match="the server requires TLS: set FLEET_NATS_CA"):
        await asyncio.wait_for(connect(recorded[0]["url"], name="e2e-plain"), 30)

    nc = await connect_recorded(mesh.state(), name="e2e-cluster")
    try:
        leaders = await eventually(lambda: replicated(nc), timeout=60, what="3 replicas each")
        assert set(leaders) == set(STORES)
        store = await open_store(nc.jetstream(), streams.SESSIONS)
        before = await turn_answered(store, "e2e", "before the kill")
        assert before == ["TurnRequested", "TurnStarted", "TurnCompleted"]

        victim = leaders[streams.SESSIONS.name]
        os.kill(node_pid(mesh, victim), signal.SIGKILL)
        # a user's turn at once, through the gateway, while SESSIONS elects a leader: its
        # session watch waited out the election (it closed the socket unanswered before)
        typed = fleet(
            "run", "asked during the election", env={"FLEET_DATA_DIR": str(mesh.data_dir)}
        )
        assert typed.returncode == 0, typed.stdout + typed.stderr
        assert "asked during the election" in typed.stdout
        after = await turn_answered(store, "e2e", "after the kill")
        assert after == ["TurnRequested", "TurnStarted", "TurnCompleted"]

        # the supervisor restarts the node; it catches up and every store has 3 replicas again
        await eventually(lambda: replicated(nc), timeout=90, what="the node to rejoin")
        assert f"{victim} exited with -9" in mesh.printed()
        status = fleet("status", "--data-dir", str(mesh.data_dir))
        assert status.returncode == 0, status.stdout + status.stderr
        assert "down" not in status.stdout
    finally:
        await nc.close()


def test_an_even_cluster_size_is_refused_naming_why(tmp_path: Path) -> None:
    refused = fleet("up", "--data-dir", str(tmp_path / "d"), "--cluster", "2", "--llm", "none")
    assert refused.returncode == 2
    said = " ".join(refused.stdout.split())
    assert "--cluster 2: 2 nodes need 2 for a quorum" in said
    assert "use an odd size: 3" in said
    assert not (tmp_path / "d" / "nats").exists()  # nothing started


def test_a_cluster_and_nats_url_together_are_refused(tmp_path: Path) -> None:
    args = ("up", "--data-dir", str(tmp_path / "d"), "--cluster", "3", "--llm", "none")
    refused = fleet(*args, env={"NATS_URL": "nats://127.0.0.1:1"})
    assert refused.returncode == 2
    assert "--cluster starts nodes of its own" in " ".join(refused.stdout.split())
