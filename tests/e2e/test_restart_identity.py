"""A restarted `fleet up` on the same data dir: the broker comes back under the same replica
name and revives its session sandbox with its files; another tenant's first sandbox gets
neither that sandbox's uid nor its files (issue 8: the new broker had a new name, adopted
nothing, and the uid pool handed the old uid, files and all, to the next tenant)."""

import asyncio
import signal
from typing import Any

import pytest
from nats.aio.client import Client

from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.bus import Ping, Pong
from fleet_events.envelope import new_id
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.connection import connect

from .conftest import StartMesh, descendants, living
from .test_fleet_up import ready

pytestmark = pytest.mark.slow


async def ask(
    nc: Client, verb: verbs.Verb[Any, Any], target: str | None = None, **fields: Any
) -> Any:
    request = verb.request(request_id=new_id(), **fields)
    return await rpc.call_verb(nc, verb, request, target=target, timeout=60)


async def broker_pong(nc: Client) -> Pong:
    async def pong() -> Pong | None:
        try:
            return await rpc.call_verb(nc, verbs.ping("sandbox-broker"), Ping(), timeout=0.5)
        except Exception:  # no responders while it starts
            return None

    return await eventually(pong, timeout=60, what="the broker to answer ping")


async def run_cell(nc: Client, tenant: str, sandbox: str, code: str) -> Any:
    context = new_id()
    await ask(nc, verbs.OPEN_CONTEXT, sandbox, tenant=tenant, sandbox=sandbox, context=context)
    reply = await ask(
        nc, verbs.EXECUTE, sandbox, tenant=tenant, sandbox=sandbox, context=context, code=code
    )
    assert reply.kind == "result", reply
    return reply.value


async def test_a_restarted_mesh_revives_its_brokers_sandboxes_and_leaks_none(
    start_mesh: StartMesh,
) -> None:
    mesh = start_mesh()
    await ready(mesh)
    nc = await connect(str(mesh.state()["nats"]), name="test")
    try:
        before = await broker_pong(nc)
        alice = await ask(nc, verbs.CREATE_SANDBOX, tenant="t-alice", fork_ready=False,
                          labels={"session": "s1", "role": "session"})  # fmt: skip
        await ask(nc, verbs.PUT_FILE, alice.sandbox, tenant="t-alice", sandbox=alice.sandbox,
                  path="secret.txt", data=b"ALICE-ONLY")  # fmt: skip
    finally:
        await nc.close()
    tree = descendants(mesh.process.pid)
    groups = {p.pgid for p in living(tree, set())}
    mesh.process.send_signal(signal.SIGKILL)  # its children are told to stop (pdeathsig)
    await asyncio.to_thread(mesh.process.wait, 30)
    await eventually(lambda: living(tree, groups) == [], timeout=60, what="the old mesh gone")

    again = start_mesh(data_dir=mesh.data_dir)
    await ready(again)
    nc = await connect(str(again.state()["nats"]), name="test")
    try:
        after = await broker_pong(nc)
        assert after.pid != before.pid
        assert after.replica == before.replica

        async def revived() -> sb.SandboxInfo | None:
            try:
                info: sb.SandboxInfo = await ask(
                    nc, verbs.GET_SANDBOX, alice.sandbox, tenant="t-alice", sandbox=alice.sandbox
                )
            except Exception:  # no responders until it is revived
                return None
            return info if info.status == "running" else None

        info = await eventually(revived, timeout=60, what="alice's sandbox revived")
        assert info.workspace == alice.workspace
        read = await ask(nc, verbs.GET_FILE, alice.sandbox, tenant="t-alice",
                         sandbox=alice.sandbox, path="secret.txt")  # fmt: skip
        assert read.data == b"ALICE-ONLY"
        bob = await ask(nc, verbs.CREATE_SANDBOX, tenant="t-bob", fork_ready=False)
        assert bob.uid != info.uid
        seen = await run_cell(
            nc, "t-bob", bob.sandbox,
            f"try:\n    seen = open({alice.workspace + '/secret.txt'!r}).read()\n"
            "except OSError as exc:\n    seen = type(exc).__name__\nseen",
        )  # fmt: skip
        assert seen != "ALICE-ONLY"
    finally:
        await nc.close()
