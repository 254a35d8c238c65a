"""Issue 28 item 3: a fork bomb stops at the host-wide pids cgroup (`providers.tasks`), which
every sandbox family of the host shares: at most its `pids.max`, where the family's own limit
(`family_nproc`, 412 tasks here) would have let it make hundreds, so many families' bombs
together cannot take the host's pid space; the host's own processes (the services') are
outside it and keep forking; a sandbox of another family runs and forks again once the bomb
ends (while the bound is full, other sandboxes cannot start tasks: docs/sandboxes.md). Real
sandboxes, as processes, in a cgroup of this test's own (a small limit no other mesh on the
host shares)."""

import asyncio
from pathlib import Path

import msgspec

from fleet_events import new_id
from fleet_harness.waits import eventually
from fleet_sandbox_broker.providers.local import LocalSandbox, family_nproc, member_tasks

from .provider_kit import LIMITS, provider, run, uid_block, value
from .test_fork_family import BOMB

UID_BASE = uid_block(362500)
HOST = 120
FORKS = "import subprocess\nsum(subprocess.run(['true']).returncode == 0 for _ in range(5))"


def removed(group: Path) -> bool:
    try:
        group.rmdir()  # empty once the families' processes are gone
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


async def test_a_fork_bomb_stops_at_the_host_bound_before_its_familys_own(tmp_path: Path) -> None:
    name = f"fleet-test-{new_id()[:12]}"
    async with provider(tmp_path, UID_BASE, task_cgroup=name, host_tasks=HOST) as local:
        procs = local.tasks.procs
        assert procs is not None, local.tasks.why  # machines of this kind have a pids cgroup
        group = procs.parent
        boxes: list[LocalSandbox] = []
        try:
            assert int((group / "pids.max").read_text()) == HOST
            calm = await local.create("calm", LIMITS)
            boxes.append(calm)
            assert value(await run(calm, FORKS)) == 5
            # its own allowance past the host bound: the host bound is what stops it
            bomb = await local.create("bomb", msgspec.structs.replace(LIMITS, nproc=300))
            boxes.append(bomb)
            made = value(await run(bomb, BOMB))
            assert family_nproc(LIMITS.nproc, local.settings.family_max) > 400
            assert 50 < made <= HOST  # its family's own limit would have let it make 400
            assert int((group / "pids.current").read_text()) <= HOST
            host = await asyncio.create_subprocess_exec("true")  # the host forks
            assert await host.wait() == 0
            await bomb.destroy()
            assert value(await run(calm, FORKS)) == 5  # the other family, once the bomb ends
        finally:
            for box in boxes:
                await box.destroy()
            await eventually(lambda: removed(group), timeout=30, what=f"{group} emptied")


async def test_one_members_fork_bomb_leaves_its_parent_and_sibling_forking(tmp_path: Path) -> None:
    """L6: a fork family shares one uid, so one process limit (`family_nproc`, 412 here): one
    member's bomb took all of it, and its parent and siblings could start nothing. Each member
    now has a cgroup of its own under the host's, bounded at its own allowance."""
    name = f"fleet-test-{new_id()[:12]}"
    async with provider(tmp_path, UID_BASE + 200, task_cgroup=name, host_tasks=2000) as local:
        procs = local.tasks.procs
        assert procs is not None, local.tasks.why
        group = procs.parent
        boxes: list[LocalSandbox] = []
        try:
            parent = await local.create("parent", LIMITS)
            boxes.append(parent)
            assert value(await run(parent, "base = 41\nbase")) == 41
            bomber = await local.fork(parent, "bomber")
            boxes.append(bomber)
            sibling = await local.fork(parent, "sibling")
            boxes.append(sibling)
            own = member_tasks(LIMITS.nproc)
            for box in boxes:
                assert int((group / box.id / "pids.max").read_text()) == own
                assert str(box.pid) in (group / box.id / "cgroup.procs").read_text().split()
            made = value(await run(bomber, BOMB))
            assert 0 < made < own  # its own bound, not the family's 412
            assert family_nproc(LIMITS.nproc, local.settings.family_max) > 400
            assert value(await run(parent, FORKS)) == 5
            assert value(await run(sibling, FORKS)) == 5
            assert value(await run(sibling, "base + 1")) == 42
        finally:
            for box in reversed(boxes):
                await box.destroy()
            members = [group / box.id for box in boxes]
            await eventually(
                lambda: all(removed(member) for member in members), timeout=30,
                what="the members' cgroups removed",
            )  # fmt: skip
            await eventually(lambda: removed(group), timeout=30, what=f"{group} emptied")


async def test_one_tenants_bombs_fill_its_own_bound_and_another_tenant_keeps_forking(
    tmp_path: Path,
) -> None:
    """Three of tenant A's sandboxes each bomb up to their own bound (36): together they would
    fill the host's 100, and tenant B's sandbox could start nothing. A's group bounds them at
    50 together; B forks on."""
    name = f"fleet-test-{new_id()[:12]}"
    async with provider(
        tmp_path, UID_BASE + 300, task_cgroup=name, host_tasks=100, tenant_tasks=50
    ) as local:
        procs = local.tasks.procs
        assert procs is not None, local.tasks.why
        group = procs.parent
        boxes: list[LocalSandbox] = []
        try:
            theirs = []
            for index in range(3):
                box = await local.create(f"a{index}", LIMITS)
                boxes.append(box)
                await box.bind_tenant("t-a")  # as the broker does when it adopts a sandbox
                assert value(await run(box, "1")) == 1  # its first cell waits for the move
                theirs.append(box)
            other = await local.create("b0", LIMITS)
            boxes.append(other)
            await other.bind_tenant("t-b")
            assert value(await run(other, "1")) == 1
            tenant_a = group / "tenant-t-a"
            assert int((tenant_a / "pids.max").read_text()) == 50
            for box in theirs:
                assert box.group == tenant_a / box.id
                assert str(box.pid) in (tenant_a / box.id / "cgroup.procs").read_text().split()
            assert not (group / "a0").exists()  # moved: its start group is gone
            fork = await local.fork(theirs[0], "a0-fork")  # a fork stays its tenant's
            boxes.append(fork)
            assert fork.group == tenant_a / "a0-fork"
            # a bomb that finds its tenant's bound full may stop its own sandbox (it cannot
            # start its checkpoint copy after the cell): the tenant's own, and said so
            replies = [await run(box, BOMB) for box in theirs]
            assert replies[0].kind == "result"
            for reply in replies[1:]:
                assert (reply.kind, reply.error) in {
                    ("result", ""),
                    ("terminal", "the sandbox process exited"),
                }, reply
            assert int((tenant_a / "pids.current").read_text()) <= 50
            assert 3 * member_tasks(LIMITS.nproc) > 50  # unbounded, they would take the host's
            assert value(await run(other, FORKS)) == 5  # another tenant's sandbox forks on
            assert int((group / "pids.current").read_text()) < 100
        finally:
            for box in reversed(boxes):
                await box.destroy()
            await eventually(lambda: removed(group / "tenant-t-a" / "a0"), timeout=30,
                             what="a0's cgroup")  # fmt: skip
