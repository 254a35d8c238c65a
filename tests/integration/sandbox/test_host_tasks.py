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

from fleet_events import new_id
from fleet_harness.waits import eventually
from fleet_sandbox_broker.providers.local import LocalSandbox, family_nproc

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
            bomb = await local.create("bomb", LIMITS)
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
