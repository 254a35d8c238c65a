"""Deleting a sandbox leaves its live forks running (a resume moves a run to a fork of the
old sandbox, which is then deleted). A fork calls `setsid()` as it starts (runner.py,
`become_child`), so it is in a process group of its own: the parent's `killpg` does not reach
it, and the uid sweep (`kill -9 -1` as the family's uid) runs only when the family's last
member stops."""

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleet_sandbox_broker.providers.local import LocalProvider

from .provider_kit import LIMITS, provider, run, uid_block, value

UID_BASE = uid_block(360400)


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    async with provider(tmp_path, UID_BASE) as made:
        yield made


async def test_deleting_a_parent_leaves_its_forks_running(local: LocalProvider) -> None:
    parent = await local.create("parent", LIMITS)
    assert value(await run(parent, "kept = 41\nkept")) == 41
    fork = await local.fork(parent, "fork")
    grandchild = await local.fork(fork, "grandchild")
    pids = [box.pid for box in (parent, fork, grandchild)]
    assert None not in pids
    assert len({os.getpgid(pid) for pid in pids if pid is not None}) == 3  # a group each
    await parent.destroy()
    assert not parent.running
    assert fork.running
    assert grandchild.running
    assert value(await run(fork, "kept + 1")) == 42
    assert value(await run(grandchild, "kept + 2")) == 43
    # and a fork's own forks still work once the parent is gone
    late = await local.fork(fork, "late")
    assert value(await run(late, "kept")) == 41
    await fork.destroy()
    assert value(await run(grandchild, "kept")) == 41
    assert value(await run(late, "kept")) == 41
    for box in (late, grandchild):
        await box.destroy()
