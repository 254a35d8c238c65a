"""A uid is never handed out while files of a sandbox given that uid remain on disk.

The attack: a broker killed without discarding its sandboxes left their workspaces (mode 700,
owned by their uids); the next broker's pool handed one of those uids to another tenant's
sandbox, which read and wrote the old workspace. Replayed here with a real first provider in
a process of its own, SIGKILLed, and a second provider on the same root and lock directory.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_sandbox_broker.errors import SandboxError
from fleet_sandbox_broker.providers.uids import sweep_orphans

from .provider_kit import LIMITS, provider, run, uid_block, value

UID_BASE = uid_block(360300)

FIRST_BROKER = """
import asyncio, json, sys
from pathlib import Path
from fleet_events.sandbox import Limits
from fleet_sandbox_broker.providers.local import LocalProvider, LocalSettings

async def main():
    tmp = Path(sys.argv[1])
    local = LocalProvider(LocalSettings(root=tmp / "root", uid_base=int(sys.argv[2]),
                                        uid_count=2, uid_locks=tmp / "uid-locks"))
    box = await local.create("old", Limits(wall_s=30))
    await box.write_file("secret.txt", b"tenant A's secret")
    print(json.dumps({"uid": box.uid, "workspace": str(box.workspace)}), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.fixture
def dead_broker(tmp_path: Path) -> dict[str, object]:
    """A provider that made sandbox `old`, wrote a file in it, and was SIGKILLed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", FIRST_BROKER, str(tmp_path), str(UID_BASE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        left: dict[str, object] = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    # what a starting broker does first (app.setup): strays of dead brokers are killed
    sweep_orphans(tmp_path / "uid-locks", UID_BASE, 2)
    return left


async def test_a_dead_sandboxs_uid_is_not_reused_while_its_files_remain(
    tmp_path: Path, dead_broker: dict[str, object]
) -> None:
    old_uid, old_ws = dead_broker["uid"], Path(str(dead_broker["workspace"]))
    assert (old_ws / "secret.txt").stat().st_uid == old_uid
    async with provider(tmp_path, UID_BASE, uid_count=2) as local:
        box = await local.create("new", LIMITS)
        try:
            assert box.uid != old_uid
            seen = await run(box, f"open({str(old_ws / 'secret.txt')!r}).read()")
            assert seen.kind == "error"
            assert "PermissionError" in seen.error
            assert "tenant A" not in seen.error + seen.stdout
        finally:
            await box.destroy()


async def test_with_every_free_uid_still_owning_files_the_refusal_says_why(
    tmp_path: Path, dead_broker: dict[str, object]
) -> None:
    async with provider(tmp_path, UID_BASE, uid_count=1) as local:
        with pytest.raises(SandboxError) as caught:
            await local.create("new", LIMITS)
        assert caught.value.message == (
            "no sandbox uid is free: 0 of 1 are in use and 1 still own files of sandboxes "
            "that were never discarded; discard those sandboxes or raise the uid count"
        )
        await local.discard("old")
        box = await local.create("new", LIMITS)
        try:
            assert box.uid == dead_broker["uid"]
            assert value(await run(box, "import os\nos.listdir('.')")) == []
        finally:
            await box.destroy()


async def test_a_revived_sandbox_gets_its_files_back_under_its_new_uid(
    tmp_path: Path, dead_broker: dict[str, object]
) -> None:
    async with provider(tmp_path, UID_BASE, uid_count=2) as local:
        box = await local.create("old", LIMITS, revive=True)
        try:
            assert value(await run(box, "open('secret.txt').read()")) == "tenant A's secret"
            owners = {os.lstat(p).st_uid for p in (box.workspace, box.workspace / "secret.txt")}
            assert owners == {box.uid}
        finally:
            await box.destroy()


async def test_files_left_without_a_record_are_found_at_start(tmp_path: Path) -> None:
    """Records live beside the uid locks (a tmpfs, gone after a reboot): a provider starting
    on a root with sandbox directories and no records still skips their uids."""
    async with provider(tmp_path, UID_BASE + 10, uid_count=1) as local:
        box = await local.create("left", LIMITS)
        await box.write_file("secret.txt", b"x")
        await box.stop("simulated crash")
    for record in (tmp_path / "uid-locks").glob("*.dirs"):
        record.unlink()
    async with provider(tmp_path, UID_BASE + 10, uid_count=1) as local:
        with pytest.raises(SandboxError, match="1 still own files"):
            await local.create("next", LIMITS)
