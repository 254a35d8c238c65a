"""The child isolation policy over the bus: each branch, the sandbox the child got, the event."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.bus import Ping
from fleet_events.codec import Codec
from fleet_events.envelope import BlobRef, new_id
from fleet_harness.daytona_fake import DaytonaFake
from fleet_harness.procs import Replica
from fleet_harness.waits import eventually_sync
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.rpc import RemoteError
from fleet_mesh.runtime_config import RuntimeConfig
from fleet_mesh.store import EventStore

from .provider_kit import volume_file

SNAPSHOT = "artifacts/rlm-inputs/local_workspace_snapshot.txt"


@pytest.fixture
def tenant_bus(nats_server: NatsServer, broker: Replica) -> Iterator[SandboxBus]:
    """A tenant of its own, so per-tenant policy settings touch no other test."""
    with SandboxBus(nats_server.url, tenant=f"t-{new_id()[:10]}") as bus:
        yield bus


def set_policy(bus: SandboxBus, key: str, value: str) -> None:
    async def put() -> None:
        config = await RuntimeConfig.open(bus.nc.jetstream())
        await config.set(key, value, tenant=bus.tenant)

    bus.run(put(), timeout=10)


def events(bus: SandboxBus, sandbox: str) -> list[tuple[int, Any]]:
    async def read() -> list[tuple[int, Any]]:
        js = bus.nc.jetstream()
        store = EventStore(js, streams.SANDBOXES, Codec(await JetStreamBlobs.open(js)))
        return [
            (s.seq, s.envelope.data)
            async for s in store.replay(sb.sandbox_subject(bus.tenant, sandbox))
        ]

    return bus.run(read(), timeout=20)


def decisions(bus: SandboxBus, parent: str) -> list[sb.ChildIsolationDecided]:
    return [e for _, e in events(bus, parent) if isinstance(e, sb.ChildIsolationDecided)]


def build_child(bus: SandboxBus, parent: str, context: str) -> sb.ChildSandbox:
    request = sb.BuildChild(
        request_id=new_id(), tenant=bus.tenant, sandbox=parent, context=context,
        labels={"run": "child-run", "task": "t1"},
    )  # fmt: skip
    return bus.call(verbs.BUILD_CHILD, request, target=parent, timeout=60)


def create(bus: SandboxBus, **fields: Any) -> sb.SandboxInfo:
    request = sb.CreateSandbox(
        request_id=new_id(), tenant=bus.tenant, labels={"session": "s1", "role": "session"},
        **fields,
    )  # fmt: skip
    return bus.call(verbs.CREATE_SANDBOX, request, timeout=60)


@pytest.fixture(scope="module")
def git_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A local repository with two commits; returns (path, first commit)."""
    repo = tmp_path_factory.mktemp("repo")

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip

    git("init", "-q")
    (repo / "README").write_text("version one\n")
    git("add", "README")
    git("commit", "-q", "-m", "one")
    first = git("rev-parse", "HEAD")
    (repo / "README").write_text("version two\n")
    git("commit", "-q", "-am", "two")
    return str(repo), first


def test_auto_without_a_volume_forks_the_parent(provider_bus: SandboxBus) -> None:
    tenant_bus = provider_bus  # on each provider; what a fork keeps is what it declares
    parent = create(tenant_bus)
    repl = RemoteInterpreter(tenant_bus, parent.sandbox)
    repl.execute("found = 'parent state'\nopen('notes.txt', 'w').write('parent file')")
    child = build_child(tenant_bus, parent.sandbox, repl.context)
    assert child.branch == "fork"
    assert child.sandbox != parent.sandbox
    child_repl = RemoteInterpreter(tenant_bus, child.sandbox, context=child.context)
    assert child_repl.execute("open('notes.txt').read()") == "parent file"
    assert parent.capabilities is not None
    if parent.capabilities.fork_keeps_repl_memory:
        assert child_repl.execute("found") == "parent state"
    else:  # Daytona: a fork copies the filesystem, and no process
        assert parent.provider == "daytona"
        with pytest.raises(Exception, match="NameError"):
            child_repl.execute("found")
    child_repl.execute("open('notes.txt', 'w').write('child file')")
    assert repl.execute("open('notes.txt').read()") == "parent file"  # never flows back
    child_repl.shutdown()
    (decided,) = decisions(tenant_bus, parent.sandbox)
    assert decided.branch == "fork"
    assert decided.child == child.sandbox
    assert "no durable volume" in decided.reason
    info = tenant_bus.sandbox_info(child.sandbox)
    assert info.labels["role"] == "child"
    assert info.labels["parent"] == parent.sandbox
    assert info.labels["run"] == "child-run"
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)


def test_auto_with_a_volume_gives_a_clean_child_on_a_child_subpath_with_the_repo(
    provider_bus: SandboxBus, broker: Replica, daytona_fake: DaytonaFake, git_repo: tuple[str, str]
) -> None:
    tenant_bus = provider_bus
    url, first = git_repo
    parent = create(
        tenant_bus, volume="vol1", volume_subpath="sessions/s1", repo_url=url, ref=first,
        context_paths=["repo"],
    )  # fmt: skip
    repl = RemoteInterpreter(tenant_bus, parent.sandbox)
    assert repl.execute("open('repo/README').read()") == "version one\n"
    repl.execute("secret_state = 1\nopen('volume/kept.txt', 'w').write('on the volume')")
    child = build_child(tenant_bus, parent.sandbox, repl.context)
    assert child.branch == "clean_volume"
    assert child.volume_subpath == f".children/{child.sandbox}"
    assert child.context_paths == ["repo"]
    child_repl = RemoteInterpreter(tenant_bus, child.sandbox, context=child.context)
    assert child_repl.execute("'secret_state' in globals()") is False
    assert child_repl.execute("open('repo/README').read()") == "version one\n"
    child_repl.execute("open('volume/child.txt', 'w').write('child')")
    child_repl.shutdown()

    def kept(path: str) -> str:
        return volume_file(
            broker, daytona_fake, parent.provider, tenant_bus.tenant, "vol1", path
        ).read_text()

    assert kept("sessions/s1/kept.txt") == "on the volume"
    # outside the volume's tree: the parent can never reach (or plant links in) it
    assert kept(f".children/{child.sandbox}/child.txt") == "child"
    assert repl.execute("import os\nos.path.exists('volume/child.txt')") is False
    (decided,) = decisions(tenant_bus, parent.sandbox)
    assert (decided.branch, decided.child) == ("clean_volume", child.sandbox)
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)


def _unforkable_parent(bus: SandboxBus) -> tuple[sb.SandboxInfo, RemoteInterpreter]:
    parent = create(bus)
    repl = RemoteInterpreter(bus, parent.sandbox)
    # a thread still running at the end of a cell leaves no quiet point to fork from
    repl.execute("import threading\nstop = threading.Event()\n"
                 "threading.Thread(target=stop.wait, daemon=True).start()")  # fmt: skip
    return parent, repl


def warm(bus: SandboxBus) -> int:
    return int(bus.call(verbs.ping("sandbox-broker"), Ping(), timeout=5).details["warm"])


def warm_started(bus: SandboxBus) -> int:
    """How many sandboxes the broker's warm pool has started so far. A sandbox taken from the
    pool shows as this rising (the pool starts one in its place), never as a missed moment:
    reading `warm` right after a take raced that refill."""
    details = bus.call(verbs.ping("sandbox-broker"), Ping(), timeout=5).details
    return int(details["warm_started"])


def test_a_failed_fork_falls_back_to_a_clean_child(
    provider_bus: SandboxBus, daytona_fake: DaytonaFake
) -> None:
    tenant_bus = provider_bus
    parent, repl = _unforkable_parent(tenant_bus)
    local = parent.provider == "local"
    if local:
        eventually_sync(lambda: warm(tenant_bus) == 2, timeout=30, what="a full warm pool")
        started = warm_started(tenant_bus)
    else:  # a container-class Daytona sandbox answers a fork with 422
        daytona_fake.inject(422, method="POST", route="/sandbox/{sandboxIdOrName}/fork")
    child = build_child(tenant_bus, parent.sandbox, repl.context)
    assert child.branch == "clean_fallback"
    if local:  # the clean child came from the warm pool: the pool replaces what it took
        eventually_sync(lambda: warm_started(tenant_bus) > started, timeout=30,
                        what="the warm pool to replace the child's sandbox")  # fmt: skip
    child_repl = RemoteInterpreter(tenant_bus, child.sandbox, context=child.context)
    assert child_repl.execute("'stop' in globals()") is False
    assert tenant_bus.sandbox_info(child.sandbox).provider == parent.provider
    child_repl.shutdown()
    (decided,) = decisions(tenant_bus, parent.sandbox)
    assert decided.branch == "clean_fallback"
    assert ("no quiet point" if local else "linux-vm") in decided.reason
    repl.execute("stop.set()")
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)


def test_a_failed_fork_with_fallback_none_is_a_clear_error_and_an_event(
    tenant_bus: SandboxBus,
) -> None:
    set_policy(tenant_bus, "rlm_child_fork_fallback", "none")
    parent, repl = _unforkable_parent(tenant_bus)
    with pytest.raises(RemoteError, match="RLM_CHILD_FORK_FALLBACK=none") as caught:
        build_child(tenant_bus, parent.sandbox, repl.context)
    assert caught.value.code == "fork_failed"
    (decided,) = decisions(tenant_bus, parent.sandbox)
    assert (decided.branch, decided.child) == ("refused", None)
    repl.execute("stop.set()")
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)


def test_context_mode_gives_a_fresh_context_in_the_parents_sandbox(
    tenant_bus: SandboxBus,
) -> None:
    set_policy(tenant_bus, "rlm_child_isolation_mode", "context")
    parent = create(tenant_bus)
    repl = RemoteInterpreter(tenant_bus, parent.sandbox)
    repl.execute("mine = 1")
    child = build_child(tenant_bus, parent.sandbox, repl.context)
    assert (child.branch, child.sandbox) == ("context", parent.sandbox)
    assert child.context != repl.context
    child_repl = RemoteInterpreter(tenant_bus, child.sandbox, context=child.context)
    assert child_repl.execute("'mine' in globals()") is False
    child_repl.shutdown()
    (decided,) = decisions(tenant_bus, parent.sandbox)
    assert decided.branch == "context"
    assert "debugging only" in decided.reason
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)


def test_a_local_checkout_parent_gives_its_clean_child_a_bounded_snapshot(
    tenant_bus: SandboxBus,
) -> None:
    upload = {"src/app.py": b"print('hello')\n", "src/big.txt": b"z" * 100_000,
              "src/blob.bin": b"\0\1\2", "other/skip.txt": b"not in context"}  # fmt: skip

    async def put_all() -> dict[str, BlobRef]:
        blobs = await JetStreamBlobs.open(tenant_bus.nc.jetstream())
        return {p: await blobs.put(tenant_bus.tenant, d) for p, d in upload.items()}

    refs = tenant_bus.run(put_all(), timeout=30)
    parent = create(
        tenant_bus, volume="vol2", context_files=refs, context_paths=["src"], local_checkout=True
    )
    repl = RemoteInterpreter(tenant_bus, parent.sandbox)
    child = build_child(tenant_bus, parent.sandbox, repl.context)
    assert child.branch == "clean_volume"
    assert child.context_paths == ["src", SNAPSHOT]
    text = tenant_bus.read_file(child.sandbox, SNAPSHOT).decode()
    assert "=== src/app.py (15 bytes) ===\nprint('hello')" in text
    assert "=== src/big.txt (100000 bytes (cut)) ===" in text
    assert "z" * 32 * 1024 in text
    assert "z" * (32 * 1024 + 1) not in text
    assert "blob.bin" not in text
    assert "not in context" not in text
    assert len(text.encode()) <= 256 * 1024
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)


def test_children_are_deleted_before_their_parent(provider_bus: SandboxBus) -> None:
    tenant_bus = provider_bus
    parent = create(tenant_bus)
    repl = RemoteInterpreter(tenant_bus, parent.sandbox)
    first = build_child(tenant_bus, parent.sandbox, repl.context)
    second = build_child(tenant_bus, parent.sandbox, repl.context)
    tenant_bus.delete_sandbox(first.sandbox)  # after its task
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)  # takes the remaining child first

    def deleted_at(sandbox: str) -> int:
        return next(seq for seq, e in events(tenant_bus, sandbox)
                    if isinstance(e, sb.SandboxDeleted))  # fmt: skip

    assert deleted_at(first.sandbox) < deleted_at(second.sandbox) < deleted_at(parent.sandbox)


def test_volume_browsing_is_capped_and_refuses_traversal(tenant_bus: SandboxBus) -> None:
    parent = create(tenant_bus, volume="vol3")
    repl = RemoteInterpreter(tenant_bus, parent.sandbox)
    repl.execute("import os\nos.makedirs('volume/d')\nopen('volume/d/f.txt', 'w').write('x' * 50)\n"
                 "os.symlink('/etc/passwd', 'volume/link')")  # fmt: skip
    listing = tenant_bus.call(
        verbs.LIST_VOLUME,
        sb.ListVolume(request_id=new_id(), tenant=tenant_bus.tenant, volume="vol3", path="d"),
        timeout=10,
    )
    assert [(e.name, e.kind, e.size) for e in listing.entries] == [("f.txt", "file", 50)]

    def read(path: str, max_bytes: int = 1000) -> sb.FileContent:
        request = sb.ReadVolumeFile(
            request_id=new_id(), tenant=tenant_bus.tenant, volume="vol3", path=path,
            max_bytes=max_bytes,
        )  # fmt: skip
        return tenant_bus.call(verbs.READ_VOLUME_FILE, request, timeout=10)

    assert read("d/f.txt").data == b"x" * 50
    for path in ("../other", "/etc/passwd", "d/../../x", "link"):
        with pytest.raises(RemoteError) as caught:
            read(path)
        assert caught.value.code == "path_refused", path
    with pytest.raises(RemoteError, match="50 bytes, over the 10-byte read limit") as caught:
        read("d/f.txt", max_bytes=10)
    assert caught.value.code == "too_large"
    with pytest.raises(RemoteError, match="invalid volume id"):
        tenant_bus.call(
            verbs.LIST_VOLUME,
            sb.ListVolume(request_id=new_id(), tenant=tenant_bus.tenant, volume=".."),
            timeout=10,
        )
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)


def test_the_warm_pool_refills_after_being_drained(tenant_bus: SandboxBus) -> None:
    eventually_sync(lambda: warm(tenant_bus) == 2, timeout=30, what="a full warm pool")
    started = warm_started(tenant_bus)
    made = [create(tenant_bus) for _ in range(3)]
    # both pooled sandboxes were taken (the third create may find one already refilled), and
    # the pool is full again
    eventually_sync(lambda: warm_started(tenant_bus) >= started + 2 and warm(tenant_bus) == 2,
                    timeout=30, what="the warm pool to refill")  # fmt: skip
    for info in made:
        tenant_bus.delete_sandbox(info.sandbox)


SWAP = """
import os, threading
stop, seen = threading.Event(), []
os.makedirs("volume/children", exist_ok=True)  # the parent owns it: it may swap entries
def swap():
    while not stop.is_set():
        for base in ('volume/children', 'volume/.children'):
            try:
                names = os.listdir(base)
            except OSError:
                continue
            for name in names:
                path = os.path.join(base, name)
                if os.path.islink(path):
                    continue
                try:
                    os.rmdir(path)
                    os.symlink({decoy!r}, path)
                    seen.append(name)
                except OSError:
                    pass
        stop.wait(0.0005)
threading.Thread(target=swap, daemon=True).start()
"""


def test_a_parent_cannot_swap_its_childs_volume_for_a_host_directory(
    tenant_bus: SandboxBus, broker: Replica, tmp_path: Path
) -> None:
    """A parent's thread watches its volume for the child's directory and swaps it for a link
    to a root-only host directory. The child's volume lives outside the parent's tree, so the
    swap never finds it: the child gets an empty volume, the host files stay root's."""
    os.chmod(tmp_path, 0o700)
    decoy = tmp_path / "decoy"
    decoy.mkdir(mode=0o700)
    secret = decoy / "secret.txt"
    secret.write_text("root only")
    os.chmod(secret, 0o600)
    parent = create(tenant_bus, volume="vol1", volume_subpath="race")
    repl = RemoteInterpreter(tenant_bus, parent.sandbox)
    repl.execute(SWAP.format(decoy=str(decoy)))
    child = build_child(tenant_bus, parent.sandbox, repl.context)
    assert child.branch == "clean_volume"
    child_repl = RemoteInterpreter(tenant_bus, child.sandbox, context=child.context)
    assert child_repl.execute("import os\nos.listdir('volume')") == []
    child_repl.shutdown()
    assert repl.execute("stop.set()\nseen") == []
    for path in (decoy, secret):
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (0, 0)
    assert secret.read_text() == "root only"
    volumes = Path(broker.env["FLEET_SANDBOX_VOLUMES"]) / tenant_bus.tenant
    home = volumes / ".children/vol1" / child.sandbox
    assert home.is_dir()
    assert not home.is_symlink()
    assert os.listdir(volumes / "vol1/race/children") == []
    repl.shutdown()
    tenant_bus.delete_sandbox(parent.sandbox)


def test_a_request_cannot_name_a_childs_volume(tenant_bus: SandboxBus) -> None:
    with pytest.raises(RemoteError, match="refused"):
        create(tenant_bus, volume="vol1", volume_subpath=".children/someone")
