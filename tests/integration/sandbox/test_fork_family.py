"""A fork family shares one uid (a fork cannot change uid: sandboxes hold no capability), and
the kernel counts every task of a uid against `RLIMIT_NPROC`: each member's process, cell
thread and checkpoint copy. With the limit at one sandbox's `nproc`, a family past a handful
of members could fork no more (the forked process could not start: "the sandbox process
exited"), which is how a depth-3 fan-out-4 tree of child runs under the fork policy died. A
fork-ready sandbox's limit is now sized for the largest family it may have (`family_nproc`:
`nproc` shared by the family's own code, plus `FAMILY_TASKS` per further member), and a fork
past `family_max` members is refused, so the broker falls back to a clean child. Real
sandboxes, as processes.
"""

import os
from pathlib import Path

import msgspec
import pytest

from fleet_harness.waits import eventually
from fleet_sandbox_broker.errors import ForkFailed
from fleet_sandbox_broker.providers.local import LocalSandbox, family_nproc

from .provider_kit import LIMITS, provider, run, uid_block, value

UID_BASE = uid_block(360500)
SMALL = msgspec.structs.replace(LIMITS, nproc=8)
MEMBERS = 12  # the root and 11 forks, each with its own tasks: far past nproc=8


def max_processes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max processes"):
            return int(line.split()[2])
    raise AssertionError(f"no process limit for {pid}")


def tasks_of(uid: int) -> int:
    """Live tasks of `uid` (zombies excepted: nothing here reaps an orphan but the host's
    init)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid != uid:
                    continue
                state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


BOMB = """
import os, time
made = 0
try:
    for _ in range(10000):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        made += 1
except OSError:
    pass
made
"""


async def test_a_fork_family_past_one_sandboxs_nproc_keeps_forking(tmp_path: Path) -> None:
    async with provider(tmp_path, UID_BASE, family_max=MEMBERS) as local:
        root = await local.create("root", SMALL)
        assert value(await run(root, "base = 41\nbase")) == 41
        family: list[LocalSandbox] = [root]
        for index in range(MEMBERS - 1):
            parent = family[index // 2]  # forks of forks too: a tree, as child runs make
            child = await local.fork(parent, f"fork-{index}")
            family.append(child)
            # every member runs cells: its cell thread and checkpoint copy are up
            assert value(await run(child, "base + 1")) == 42
            assert value(await run(child, "base + 2")) == 43
        uid = root.uid
        assert {box.uid for box in family} == {uid}
        assert tasks_of(uid) > SMALL.nproc  # the family really is past one sandbox's limit
        limit = family_nproc(SMALL.nproc, MEMBERS)
        assert {max_processes(box.pid) for box in family if box.pid} == {limit}
        # one more member than the family may have: refused before anything is made
        with pytest.raises(ForkFailed, match="FLEET_SANDBOX_FAMILY_MAX=12"):
            await local.fork(root, "one-too-many")
        assert not (local.settings.root / "one-too-many").exists()
        # a member that leaves gives its place back
        await family.pop().destroy()
        family.append(await local.fork(root, "in-its-place"))
        assert value(await run(family[-1], "base")) == 41
        # the family's own code is bounded by the family's limit: a fork bomb in one member
        # stops there, and every member still answers
        made = value(await run(family[-1], BOMB))
        assert 0 < made < limit
        for box in family[:-1]:
            assert value(await run(box, "base")) == 41
        for box in reversed(family):
            await box.destroy()
        # the last member's leaving released the uid and swept what was left of it
        await eventually(lambda: tasks_of(uid) == 0, timeout=10, what="the family's tasks gone")


async def test_a_sandbox_that_cannot_fork_keeps_one_sandboxs_limit(tmp_path: Path) -> None:
    async with provider(tmp_path, UID_BASE + 100, family_max=MEMBERS) as local:
        box = await local.create("plain", SMALL, fork_ready=False)
        assert value(await run(box, "1")) == 1
        assert box.pid is not None
        assert max_processes(box.pid) == SMALL.nproc
        await box.destroy()
