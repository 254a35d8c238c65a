"""Cloning a tenant's repository: refs and URLs never reach git as options, git's stderr never
reaches the caller, and the clone runs as the sandbox's uid, never as root."""

import asyncio
import os
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleet_harness.waits import eventually
from fleet_sandbox_broker.errors import BadSpec
from fleet_sandbox_broker.providers.local import LocalProvider

from .provider_kit import LIMITS, provider, run, uid_block, value

UID_BASE = uid_block(360000)


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    async with provider(tmp_path, UID_BASE) as made:
        yield made


@pytest.fixture
def repo(tmp_path: Path) -> tuple[str, str]:
    """A repository only root can read (its directory is 0700): (path, first commit)."""
    path = tmp_path / "src"
    path.mkdir(mode=0o700)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(path), *args],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip

    git("init", "-q")
    (path / "README").write_text("one\n")
    git("add", "README")
    git("commit", "-q", "-m", "one")
    first = git("rev-parse", "HEAD")
    (path / "README").write_text("two\n")
    git("commit", "-q", "-am", "two")
    return str(path), first


async def test_a_ref_that_git_would_read_as_an_option_is_refused(
    local: LocalProvider, repo: tuple[str, str]
) -> None:
    """The attack: `ref="--pathspec-from-file=/etc/shadow"` made root's git read the file and
    echo its lines back in the error."""
    box = await local.create("g1", LIMITS)
    try:
        with pytest.raises(BadSpec) as caught:
            await local.clone_repo(
                box, repo[0], "--pathspec-from-file=/etc/shadow", allow_local=True
            )
        message = caught.value.message
        assert "starts with '-'" in message
        assert "root:" not in message
        assert not (box.workspace / "repo").exists()  # refused before git ran
    finally:
        await box.destroy()


async def test_git_failures_give_a_generic_reason_never_gits_stderr(
    local: LocalProvider, repo: tuple[str, str]
) -> None:
    box = await local.create("g2", LIMITS)
    try:
        with pytest.raises(BadSpec) as caught:
            await local.clone_repo(box, repo[0], "no-such-branch", allow_local=True)
        assert caught.value.message == (
            f"cannot check out {repo[0]!r} at 'no-such-branch': the repository or ref was not "
            "found or is unreachable"
        )
    finally:
        await box.destroy()


async def test_a_clone_at_a_commit_is_the_sandboxs_own(
    local: LocalProvider, repo: tuple[str, str]
) -> None:
    path, first = repo
    box = await local.create("g3", LIMITS)
    try:
        await local.clone_repo(box, path, first, allow_local=True)
        assert value(await run(box, "open('repo/README').read()")) == "one\n"
        owners = {
            os.lstat(os.path.join(d, name)).st_uid
            for d, dirs, files in os.walk(box.workspace / "repo")
            for name in (*dirs, *files)
        }
        assert owners == {box.uid}
    finally:
        await box.destroy()


async def test_the_network_fetch_runs_as_the_sandboxs_uid(local: LocalProvider) -> None:
    """A git:// server on loopback that never answers: while git waits on it, the process
    holding the connection is found by its socket and must belong to the sandbox's uid."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    box = await local.create("g4", LIMITS)
    clone = asyncio.create_task(
        local.clone_repo(box, f"git://127.0.0.1:{port}/r.git", "main", allow_local=False)
    )
    try:
        loop = asyncio.get_running_loop()
        conn, peer = await asyncio.wait_for(loop.run_in_executor(None, server.accept), 30)
        (owner,) = await eventually(  # a 1-tuple: uid 0 (root) must not read as "not yet"
            lambda: _uid_of_socket_peer(peer[1]), timeout=20, what="the connecting process"
        )
        assert owner == box.uid
        assert owner != 0
        conn.close()
        with pytest.raises(BadSpec, match="not found or is unreachable"):
            await clone
    finally:
        server.close()
        if not clone.done():
            clone.cancel()
        await box.destroy()


def _uid_of_socket_peer(port: int) -> tuple[int] | None:
    """The uid of the process whose TCP socket has local port `port` (from /proc/net/tcp)."""
    inode = None
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port:
                inode = fields[9]
    if inode is None:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return (os.stat(f"/proc/{pid}").st_uid,)
        except OSError:
            continue
    return None
