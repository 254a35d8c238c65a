"""Files the sandbox planted to trap the broker (links swapped mid-walk, FIFOs) trap nothing."""

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.envelope import BlobRef, new_id
from fleet_harness.procs import Replica
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.rpc import RemoteError

SNAPSHOT = "artifacts/rlm-inputs/local_workspace_snapshot.txt"
SECRET = "root-only-secret-9f3a2b"


@pytest.fixture
def tenant_bus(nats_server: NatsServer, broker: Replica) -> Iterator[SandboxBus]:
    with SandboxBus(nats_server.url, tenant=f"t-{new_id()[:10]}") as bus:
        yield bus


def local_checkout_parent(bus: SandboxBus, volume: str) -> sb.SandboxInfo:
    async def put() -> dict[str, BlobRef]:
        blobs = await JetStreamBlobs.open(bus.nc.jetstream())
        return {"ctx/d/f.txt": await blobs.put(bus.tenant, b"the parent's own file\n")}

    request = sb.CreateSandbox(
        request_id=new_id(), tenant=bus.tenant, labels={"session": "s1", "role": "session"},
        volume=volume, context_files=bus.run(put(), timeout=30), context_paths=["ctx"],
        local_checkout=True,
    )  # fmt: skip
    return bus.call(verbs.CREATE_SANDBOX, request, timeout=60)


def build_child(bus: SandboxBus, parent: str, context: str) -> sb.ChildSandbox:
    request = sb.BuildChild(
        request_id=new_id(), tenant=bus.tenant, sandbox=parent, context=context,
        labels={"run": "child-run", "task": "t1"},
    )  # fmt: skip
    return bus.call(verbs.BUILD_CHILD, request, target=parent, timeout=60)


@pytest.fixture
def root_only_dir(tmp_path: Path) -> Path:
    secret = tmp_path / "secret-dir"
    secret.mkdir(mode=0o700)
    (secret / "f.txt").write_text(SECRET)
    (secret / "f.txt").chmod(0o600)
    assert os.stat(secret / "f.txt").st_uid == 0
    assert stat.S_IMODE(os.stat(secret / "f.txt").st_mode) == 0o600
    return secret


SWAPPER = """
import os, threading, time
swaps, stop = [0], threading.Event()
def swap(target):
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        os.rename('ctx/d', 'ctx/d.real')
        os.symlink(target, 'ctx/d')
        for _ in range(3):  # hold the link a moment: a wider window for a racing reader
            os.lstat('ctx/d')
        os.unlink('ctx/d')
        os.rename('ctx/d.real', 'ctx/d')
        swaps[0] += 1
threading.Thread(target=swap, args=({target!r},), daemon=True).start()
"""


def test_a_parent_swapping_a_context_directory_for_a_link_never_leaks_into_the_snapshot(
    tenant_bus: SandboxBus, root_only_dir: Path
) -> None:
    parent = local_checkout_parent(tenant_bus, "vol-c3")
    repl = RemoteInterpreter(tenant_bus, parent.sandbox)
    repl.execute(SWAPPER.format(target=str(root_only_dir)))
    children = []
    try:
        for _ in range(3):
            child = build_child(tenant_bus, parent.sandbox, repl.context)
            children.append(child.sandbox)
            assert child.branch == "clean_volume"
            text = tenant_bus.read_file(child.sandbox, SNAPSHOT).decode()
            assert text.startswith("# Local workspace snapshot")
            assert SECRET not in text
        assert repl.execute("swaps[0]") > 0
    finally:
        repl.execute("stop.set()")
        for child_id in children:
            tenant_bus.delete_sandbox(child_id)
        repl.shutdown()
        tenant_bus.delete_sandbox(parent.sandbox)


def refused(exc: BaseException) -> bool:
    return (
        isinstance(exc, RemoteError)
        and exc.code == "path_refused"
        and "not a regular file" in str(exc)
    )


def test_fifos_are_refused_promptly_and_the_broker_keeps_serving(
    tenant_bus: SandboxBus, nats_server: NatsServer
) -> None:
    parent = local_checkout_parent(tenant_bus, "vol-fifo")
    repl = RemoteInterpreter(tenant_bus, parent.sandbox)
    repl.execute("import os\nos.mkfifo('pipe')\nos.mkfifo('volume/pipe')\nos.mkfifo('ctx/pipe')")

    def get(path: str) -> Any:
        request = sb.GetFile(
            request_id=new_id(), tenant=tenant_bus.tenant, sandbox=parent.sandbox, path=path
        )
        return rpc.call_verb(
            tenant_bus.nc, verbs.GET_FILE, request, target=parent.sandbox, timeout=10
        )

    def volume_read(path: str) -> Any:
        request = sb.ReadVolumeFile(
            request_id=new_id(), tenant=tenant_bus.tenant, volume="vol-fifo", path=path,
            max_bytes=1000,
        )  # fmt: skip
        return rpc.call_verb(tenant_bus.nc, verbs.READ_VOLUME_FILE, request, timeout=10)

    async def many() -> list[Any]:
        # more than the broker's worker threads: one blocking open each would freeze it
        calls = [get("pipe") for _ in range(8)] + [volume_read("pipe") for _ in range(8)]
        return await asyncio.gather(*calls, return_exceptions=True)

    results = tenant_bus.run(many(), timeout=20)
    assert all(refused(r) for r in results), results
    with pytest.raises(RemoteError) as caught:
        tenant_bus.put_file(parent.sandbox, "pipe", b"x", timeout=10)
    assert refused(caught.value), caught.value

    child = build_child(tenant_bus, parent.sandbox, repl.context)
    text = tenant_bus.read_file(child.sandbox, SNAPSHOT, timeout=10).decode()
    assert "=== ctx/d/f.txt" in text
    assert "pipe" not in text

    with SandboxBus(nats_server.url, tenant=f"t-{new_id()[:10]}") as other:
        info = other.create_sandbox(timeout=20)
        other.delete_sandbox(info.sandbox)
    tenant_bus.delete_sandbox(child.sandbox)
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)
