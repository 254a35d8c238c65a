"""Disk quotas the kernel enforces, per fork family (issue 28, M3 and M7).

The attacks: a background process wrote 150,032 entries past an inode cap of 100,000 while
the sandbox stayed `running` (the cap was counted only during and after cells), and one
sandbox wrote 3,000 MiB in 11.7 s onto the disk JetStream uses (no byte quota at all). Each
family now has a filesystem of its own (`providers.disks`): a loop-mounted ext4 image whose
size and inode count the kernel enforces, cells or not.
"""

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_harness.procs import Replica, start_answering
from fleet_harness.waits import eventually, eventually_sync
from fleet_mesh.natsserver import NatsServer
from fleet_sandbox_broker.providers.disks import FAMILIES
from fleet_sandbox_broker.providers.local import LocalProvider, LocalSandbox

from .provider_kit import LIMITS, provider, run, uid_block, value
from .test_bus_api import event_types

UID_BASE = uid_block(363000)
BROKER_UIDS = uid_block(363500)
DISK_MB = 8
INODES = 400

# A writer that outlives its cell: started detached, it writes until the kernel refuses and
# reports how far it got and what stopped it (the sandbox is not asked while it runs).
BYTES_WRITER = """
import subprocess, sys
script = '''
import os
written, error = 0, ''
try:
    with open('fill.bin', 'wb') as out:
        while True:
            out.write(b'x' * 65536); out.flush(); written += 65536
except OSError as e:
    error = e.strerror
open('bytes.done', 'w').write(f'{written} {error}')
'''
writer = subprocess.Popen([sys.executable, '-c', script], start_new_session=True)
writer.pid > 0
"""

INODES_WRITER = """
import subprocess, sys
script = '''
import os
os.mkdir('many')
made, error = 0, ''
try:
    while True:
        open(f'many/f{made}', 'w').close(); made += 1
except OSError as e:
    error = e.strerror
os.remove(f'many/f{made - 1}')  # one free inode for the report
open('inodes.done', 'w').write(f'{made} {error}')
'''
writer = subprocess.Popen([sys.executable, '-c', script], start_new_session=True)
writer.pid > 0
"""


def loop_mounts_here() -> str:
    """Why this machine cannot loop-mount at all ("" when it can): the facts the quota needs
    from the host, checked apart from the provider's own probe, so a machine that can has the
    quota on or the test fails."""
    if os.geteuid() != 0:
        return "not root"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control (no loop devices on this machine)"
    if shutil.which("mke2fs", path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
        return "no mke2fs (e2fsprogs; ./scripts/test installs it as root)"
    return ""


NO_LOOP = loop_mounts_here()
needs_loop = pytest.mark.skipif(bool(NO_LOOP), reason=f"no disk quota possible: {NO_LOOP}")


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    async with provider(
        tmp_path, UID_BASE, family_disk_mb=DISK_MB, max_inodes=INODES, disk_check_s=0.1
    ) as made:
        assert made.disks.on, made.disks.why  # this machine can loop-mount: the quota is on
        yield made


def mounted(path: Path) -> bool:
    return os.path.ismount(path)


def loops_of(image: Path) -> list[str]:
    found = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True)
    return found.stdout.splitlines()


def real(path: Path) -> str:
    return os.path.realpath(path)


def told(box: LocalSandbox) -> list[tuple[str, str]]:
    heard: list[tuple[str, str]] = []

    async def hook(_: Any, limit: str, detail: str) -> None:
        heard.append((limit, detail))

    box.on_full.append(hook)
    return heard


async def report(box: LocalSandbox, name: str) -> tuple[int, str]:
    done = box.workspace / name
    await eventually(done.exists, timeout=60, what=f"the background writer's {name}")
    count, _, error = done.read_text().partition(" ")
    return int(count), error


@needs_loop
async def test_a_background_writer_stops_at_the_byte_quota_and_the_sandbox_answers_on(
    local: LocalProvider,
) -> None:
    box = await local.create("bytes", LIMITS)
    heard = told(box)
    assert value(await run(box, BYTES_WRITER)) is True  # the cell ends; the writer runs on
    written, error = await report(box, "bytes.done")
    assert error == "No space left on device"
    assert 0 < written <= DISK_MB * 1024 * 1024
    assert value(await run(box, "6 * 7")) == 42  # at its quota, still answering
    await eventually(lambda: heard, timeout=20, what="the full disk told")
    assert heard[0][0] == "bytes"
    assert f"disk quota of {DISK_MB} MiB is full" in heard[0][1]
    assert box.running
    # deleting frees the quota again
    code = "import os\nos.remove('fill.bin')\nopen('after.bin', 'wb').write(b'y' * 1048576)"
    assert value(await run(box, code)) == 1048576
    assert (box.workspace / "after.bin").stat().st_size == 1048576
    await box.destroy()


@needs_loop
async def test_a_background_writer_stops_at_the_inode_quota_with_the_sandbox_running(
    local: LocalProvider,
) -> None:
    box = await local.create("inodes", LIMITS)
    heard = told(box)
    assert value(await run(box, INODES_WRITER)) is True
    made, error = await report(box, "inodes.done")
    assert error == "No space left on device"
    # mke2fs rounds -N up to whole inode tables: within a table of the quota asked
    assert INODES // 2 < made <= INODES + 512
    assert value(await run(box, "len(__import__('os').listdir('many'))")) == made - 1
    await eventually(lambda: heard, timeout=20, what="the full disk told")
    assert heard[0][0] == "inodes"
    assert box.running
    await box.destroy()


@needs_loop
async def test_a_fork_draws_on_its_familys_quota(local: LocalProvider) -> None:
    parent = await local.create("parent", LIMITS)
    three_mib = "open('{name}', 'wb').write(b'p' * 3 * 1048576)"
    assert value(await run(parent, three_mib.format(name="mine.bin"))) == 3 * 1048576
    child = await parent.fork_into("child")
    # the fork's copy of the parent's 3 MiB is in the family's 8 MiB too: 6 used
    assert (child.workspace / "mine.bin").stat().st_size == 3 * 1048576
    code = (
        "try:\n    open('more.bin', 'wb').write(b'c' * 3 * 1048576); got = 'written'\n"
        "except OSError as e:\n    got = e.strerror\ngot"
    )
    assert value(await run(child, code)) == "No space left on device"
    # and the family's filesystem is the child's, not the host's
    assert real(child.directory).startswith(str(local.settings.root / FAMILIES))
    await child.destroy()
    await parent.destroy()


@needs_loop
async def test_the_last_member_takes_its_familys_filesystem_with_it(
    local: LocalProvider,
) -> None:
    families = local.settings.root / FAMILIES
    box = await local.create("gone", LIMITS)
    child = await box.fork_into("gone-child")
    assert mounted(families / "gone")
    await box.destroy()
    assert mounted(families / "gone")  # the fork still lives in it
    assert (child.workspace).is_dir()
    await child.destroy()
    assert not mounted(families / "gone")
    assert sorted(p.name for p in families.iterdir()) == []
    assert not (local.settings.root / "gone").is_symlink()


@needs_loop
async def test_a_revive_after_the_provider_stopped_mounts_the_family_again(
    tmp_path: Path,
) -> None:
    async with provider(tmp_path, UID_BASE, family_disk_mb=DISK_MB, max_inodes=INODES) as first:
        box = await first.create("kept", LIMITS)
        assert value(await run(box, "open('note.txt', 'w').write('kept')")) == 4
        await box.stop("its broker stopped")
    families = tmp_path / "root" / FAMILIES
    assert not mounted(families / "kept")  # the stopped provider unmounted it
    async with provider(tmp_path, UID_BASE, family_disk_mb=DISK_MB, max_inodes=INODES) as again:
        revived = await again.create("kept", LIMITS, revive=True)
        assert value(await run(revived, "open('note.txt').read()")) == "kept"
        await revived.destroy()
    assert not (families / "kept.img").exists()


async def test_without_a_quota_the_inode_count_still_stops_a_sandbox(tmp_path: Path) -> None:
    """The fallback where no loop device can be made (here: turned off)."""
    async with provider(
        tmp_path, UID_BASE, family_disk_mb=0, max_inodes=300, inode_check_s=0.2
    ) as off:
        assert off.disks.why == "turned off (FLEET_SANDBOX_FAMILY_DISK_MB is 0)"
        box = await off.create("counted", LIMITS)
        assert not box.directory.is_symlink()
        many = "import os\nos.mkdir('d')\nfor i in range(400):\n    open(f'd/f{i}', 'w').close()"
        await run(box, many)
        await eventually(lambda: not box.running, timeout=20, what="the sandbox stopped")
        assert box.stopped_limit == "inodes"


# -- through the broker: the event on the sandbox's stream --------------------------------------


@pytest.fixture(scope="module")
def small_disks(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    root = tmp_path_factory.mktemp("disk-quota")
    replica = start_answering(
        "sandbox-broker",
        nats_server.url,
        root / "broker.log",
        {
            "FLEET_SANDBOX_ROOT": str(root / "root"),
            "FLEET_SANDBOX_VOLUMES": str(root / "volumes"),
            "FLEET_SANDBOX_POOL_SIZE": "0",
            "FLEET_SANDBOX_UID_BASE": str(BROKER_UIDS),
            "FLEET_SANDBOX_UID_COUNT": "16",
            "FLEET_SANDBOX_FAMILY_DISK_MB": str(DISK_MB),
            "FLEET_SANDBOX_MAX_INODES": str(INODES),
            "FLEET_SANDBOX_DISK_CHECK_S": "0.1",
            "FLEET_REPLICA": "disk-quota-broker",
        },
    )
    yield replica
    replica.stop()


@needs_loop
def test_a_full_family_disk_is_recorded_on_the_sandboxs_stream(
    small_disks: Replica, nats_server: NatsServer
) -> None:
    with SandboxBus(nats_server.url, tenant="t-disk-quota") as bus:
        info = bus.create_sandbox()
        repl = RemoteInterpreter(bus, info.sandbox)
        code = (
            "try:\n    with open('fill.bin', 'wb') as out:\n"
            "        for _ in range(256):\n            out.write(b'x' * 65536); out.flush()\n"
            "except OSError as e:\n    print(e.strerror)"
        )
        assert "No space left on device" in repl.execute(code)
        eventually_sync(
            lambda: "sandbox.disk_full" in event_types(bus, info.sandbox),
            timeout=30,
            what="sandbox.disk_full on the sandbox's stream",
        )
        assert repl.execute("print(6 * 7)").strip() == "42"  # it runs on
        assert bus.sandbox_info(info.sandbox).status == "running"
        repl.shutdown()
        bus.delete_sandbox(info.sandbox)
        assert event_types(bus, info.sandbox)[-1] == "sandbox.deleted"


@needs_loop
async def test_a_delete_while_the_family_is_unmounted_keeps_its_other_members_files(
    tmp_path: Path,
) -> None:
    """A second broker on the root started while the first had the family mounted (so it
    mounted nothing); the first stops, unmounting it; the second deletes one member: the image
    is mounted again first, so the other member's files stay."""
    first_cm = provider(tmp_path, UID_BASE, family_disk_mb=DISK_MB, max_inodes=INODES)
    first = await first_cm.__aenter__()
    parent = await first.create("fam", LIMITS)
    child = await parent.fork_into("fam-kid")
    assert value(await run(child, "open('kid.txt', 'w').write('kid')")) == 3
    await child.stop("its broker stopped")
    await parent.stop("its broker stopped")
    async with provider(tmp_path, UID_BASE, family_disk_mb=DISK_MB, max_inodes=INODES) as other:
        await first_cm.__aexit__(None, None, None)  # the first stops: it unmounts the family
        families = tmp_path / "root" / FAMILIES
        assert not mounted(families / "fam")
        await other.discard("fam")
        revived = await other.create("fam-kid", LIMITS, revive=True)
        assert value(await run(revived, "open('kid.txt').read()")) == "kid"
        await revived.destroy()
    assert not (families / "fam.img").exists()


@needs_loop
async def test_a_sandbox_revived_beside_the_provider_that_mounted_its_family_forks_after_it_stops(
    tmp_path: Path,
) -> None:
    """Two providers on one root: the second revives a sandbox while the first still has its
    family mounted; the first stops and unmounts it; the second's file write, read and fork
    of that sandbox mount it again instead of writing beside it on the host's disk."""
    first_cm = provider(tmp_path, UID_BASE, family_disk_mb=DISK_MB, max_inodes=INODES)
    first = await first_cm.__aenter__()
    box = await first.create("shared", LIMITS)
    await box.stop("its broker stopped")
    async with provider(tmp_path, UID_BASE, family_disk_mb=DISK_MB, max_inodes=INODES) as other:
        revived = await other.create("shared", LIMITS, revive=True)
        await first_cm.__aexit__(None, None, None)
        families = tmp_path / "root" / FAMILIES
        assert not mounted(families / "shared")
        await revived.write_file("note.txt", b"after")
        assert mounted(families / "shared")
        # one loop device on the image: the host and the sandbox share one filesystem
        assert len(loops_of(families / "shared.img")) == 1
        assert await revived.read_file("note.txt", 100) == b"after"
        kid = await revived.fork_into("shared-kid")
        assert value(await run(kid, "open('note.txt').read()")) == "after"
        assert real(kid.directory).startswith(str(families / "shared"))
        await kid.destroy()
        await revived.destroy()
    assert not (families / "shared.img").exists()
