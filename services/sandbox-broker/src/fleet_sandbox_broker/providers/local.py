"""The `local` provider: each sandbox is a Python process on this host, contained.

What containment means and how each part is enforced: docs/sandboxes.md. The parts:
`launch` (namespaces, the allow-listed filesystem, env, the first frame), `sandbox` (one
sandbox's process, channel and cells), `workspace` (its files: directories, fork copies,
clones), `uids` (the host-wide uid pool), `runner` (the REPL inside). This module composes
them: settings, uid families, create, fork, clone, discard.
"""

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fleet_events.envelope import new_id
from fleet_events.sandbox import Capabilities, Limits
from fleet_sandbox_broker.errors import ForkFailed
from fleet_sandbox_broker.providers import frames, launch
from fleet_sandbox_broker.providers.base import Provider, Sandbox
from fleet_sandbox_broker.providers.disks import FamilyDisks
from fleet_sandbox_broker.providers.launch import ETC, HIDE, SHOW
from fleet_sandbox_broker.providers.sandbox import LocalSandbox
from fleet_sandbox_broker.providers.tasks import (
    FAMILY_TASKS,
    drop_member,
    host_bound,
    joining,
    member_group,
    member_tasks,
    sweep_members,
    tenant_group,
)
from fleet_sandbox_broker.providers.uids import UidPool
from fleet_sandbox_broker.providers.workspace import clone, make_dirs

__all__ = [
    "ETC", "FAMILY_TASKS", "HIDE", "SHOW", "LocalProvider", "LocalSandbox", "LocalSettings",
    "family_nproc", "member_tasks",
]  # fmt: skip

MEMBER_DROP_TRIES = 12
MEMBER_DROP_EVERY_S = 0.05
"""A stopped member's cgroup is removed once its killed processes are gone: tries backing off
from 50 ms to 2 s (about 15 s in all); what is left then, a start's sweep removes."""


def family_nproc(nproc: int, family_max: int) -> int:
    """`RLIMIT_NPROC` of a fork-ready sandbox, and so of every fork of it. The kernel counts
    every task of a uid against it, and a family shares one uid (a fork cannot change uid:
    sandboxes hold no capability), so the limit must fit every member the family may have
    (`family_max`, the root included) besides `nproc`, the allowance the family's own code
    shares. An unprivileged process can lower its limit but never raise it, and the broker
    cannot change another process's limit without CAP_SYS_RESOURCE, which a container often
    lacks: so the limit is set once, at the root's start, for the largest family."""
    return nproc + (family_max - 1) * FAMILY_TASKS


CAPABILITIES = Capabilities(
    fork=True,
    fork_keeps_repl_memory=True,
    durable_volumes=True,
    network_isolation=True,
    archive=False,
)


@dataclass(frozen=True)
class LocalSettings:
    root: Path
    python: str = "/usr/bin/python3"
    uid_base: int = 310000
    uid_count: int = 4096
    max_frame: int = 4 * 1024 * 1024
    output_cap: int = 1024 * 1024
    start_timeout_s: float = 15.0
    uid_locks: Path = Path("/run/fleet-rlm/sandbox-uids")
    # host paths a sandbox sees (an allow-list; /etc only the ETC entries)
    show: tuple[str, ...] = SHOW
    # covered by an empty read-only tmpfs even where `show` would expose them (a directory
    # under /usr holding something private); none of the defaults exist inside a sandbox
    hide: tuple[str, ...] = HIDE
    # host tool calls in flight at once per sandbox; more are refused to the sandbox at once
    # (its code can write `tool` frames of its own, each would be a relay on the host)
    max_tool_calls: int = 8
    # files and directories a sandbox's workspace and tmp may hold (no quota on the host's
    # filesystems: counted while cells run, at most every `inode_check_s`, and after each)
    max_inodes: int = 100_000
    inode_check_s: float = 1.0
    # members of one fork family, the root included (a depth-3, fan-out-4 tree of child runs
    # is 85); a fork past it is refused (the broker's policy falls back to a clean child), and
    # a fork-ready sandbox's process limit is sized for it (`family_nproc`)
    family_max: int = 96
    # the host-wide pids cgroup every sandbox process joins (`tasks`; "" for none), and its
    # `pids.max` (0: half the kernel's pid_max)
    task_cgroup: str = "fleet-rlm-sandboxes"
    host_tasks: int = 0
    # each fork family's disk quota: a loop-mounted ext4 image of this many MiB with
    # `max_inodes` inodes (`disks`; 0 turns it off), and how often a sandbox looks at it
    family_disk_mb: int = 4096
    # tasks all of one tenant's sandboxes may hold together (0: a quarter of `host_tasks`)
    tenant_tasks: int = 0
    disk_check_s: float = 2.0


class LocalProvider:
    name = "local"
    capabilities = CAPABILITIES

    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings
        root = settings.root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)  # noqa: S103 - traversable, not listable: each sandbox is 700
        private = root / ".broker"
        private.mkdir(exist_ok=True)
        os.chmod(private, 0o700)
        self._setup = private / "setup.sh"
        self.tasks = host_bound(settings.task_cgroup, settings.host_tasks)
        sweep_members(self.tasks, time.time())  # what killed brokers left, empty
        # before the uid scan below: a member's link leads to its files only once mounted
        self.disks = FamilyDisks(root, settings.family_disk_mb, settings.max_inodes)
        # replaced, never rewritten in place: another broker on this root may be starting a
        # sandbox with it right now
        scratch = private / f".setup-{new_id()}.sh"
        scratch.write_text(launch.SETUP_SH)
        os.replace(scratch, self._setup)
        launch.prepare_etc(private)
        # host-wide, whatever the root: two brokers on one host must never share a uid (a
        # claim sweeps the uid's processes)
        settings.uid_locks.mkdir(parents=True, exist_ok=True, mode=0o700)
        (private / "logs").mkdir(exist_ok=True)
        self._logs = private / "logs"
        self._uids = UidPool(settings.uid_locks, settings.uid_base, settings.uid_count)
        self._uids.record_leftovers(root)
        self._families: dict[int, int] = {}
        # per family: the process that holds its pid namespace (`unshare`, in a process group
        # of its own with the namespace's init)
        self._namespaces: dict[int, subprocess.Popen[bytes]] = {}
        self._drops: set[asyncio.Task[None]] = set()
        self._tenant_groups: dict[str, Path] = {}

    @property
    def tenant_tasks(self) -> int:
        """Tasks all of one tenant's sandboxes may hold together (`tasks.tenant_group`)."""
        return self.settings.tenant_tasks or max(1, self.tasks.limit // 4)

    def tenant_group(self, tenant: str) -> Path | None:
        """The tenant's task group (`tasks.tenant_group`), made once per provider."""
        known = self._tenant_groups.get(tenant)
        if known is not None and known.is_dir():
            return known
        made = tenant_group(self.tasks, tenant, self.tenant_tasks)
        if made is not None:
            self._tenant_groups[tenant] = made
        return made

    def drop_member_later(self, group: Path | None) -> None:
        """Remove a stopped member's cgroup once its killed processes are gone (bounded: a
        process that escaped its group keeps it until the family's namespace ends)."""
        if group is None:
            return
        procs = group / "cgroup.procs"

        async def drop() -> None:
            wait = MEMBER_DROP_EVERY_S
            for _ in range(MEMBER_DROP_TRIES):
                if drop_member(procs):  # one rmdir: no thread hop (a zombie not yet reaped
                    return  # keeps the group busy, and a stop's tries must not crowd the
                await asyncio.sleep(wait)  # executor every other operation waits on)
                wait = min(wait * 2, 2.0)

        task = asyncio.get_running_loop().create_task(drop(), name=f"cgroup-{group.name}")
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    def family_join(self, uid: int) -> None:
        self._families[uid] = self._families.get(uid, 0) + 1

    def family_reserve(self, uid: int, parent: str) -> None:
        """A place in `uid`'s family for a fork about to be made, or `ForkFailed` when the
        family is full (its process limit has room for no more members)."""
        members = self._families.get(uid, 0)
        if members >= self.settings.family_max:
            raise ForkFailed(
                f"cannot fork sandbox {parent}: its fork family already has {members} members, "
                f"the most one family may have (FLEET_SANDBOX_FAMILY_MAX="
                f"{self.settings.family_max}); its process limit has room for no more"
            )
        self.family_join(uid)

    async def family_leave(self, uid: int) -> None:
        left = self._families.get(uid, 0) - 1
        if left > 0:
            self._families[uid] = left
            return
        self._families.pop(uid, None)
        namespace = self._namespaces.pop(uid, None)
        if namespace is not None:
            await asyncio.to_thread(end_namespace, namespace)
        await asyncio.to_thread(self._uids.release, uid)  # the sweep runs a process

    async def create(
        self,
        sandbox_id: str,
        limits: Limits,
        *,
        fork_ready: bool = True,
        mounts: dict[str, Path] | None = None,
        revive: bool = False,
    ) -> LocalSandbox:
        """Start a sandbox. `mounts` binds host directories (volumes) at workspace-relative
        paths; `revive` starts a new process in an existing sandbox's directory (files kept,
        REPL memory gone), after a broker restart."""
        directory = self.settings.root / sandbox_id
        if revive:  # its family's filesystem, if it has one, is mounted again if need be
            await asyncio.to_thread(self.disks.reach, directory)
        uid = await asyncio.to_thread(self._uids.claim, directory)
        mine, theirs = socket.socketpair()
        placed = False
        own: Path | None = None
        try:
            if self.disks.on and not revive:  # a new family, with a filesystem of its own
                await asyncio.to_thread(self.disks.create_family, sandbox_id)
                await asyncio.to_thread(self.disks.place, sandbox_id, sandbox_id)
                placed = True
            await asyncio.to_thread(make_dirs, directory, uid, list(mounts or {}), revive or placed)
            own = await asyncio.to_thread(
                member_group, self.tasks, sandbox_id, member_tasks(limits.nproc)
            )
            command = joining(
                own or self.tasks.procs,
                launch.argv(
                    self._setup, self.settings.root, self.settings.show, self.settings.hide,
                    mounts or {}, directory, uid, self.settings.python,
                ),
            )  # fmt: skip
            log_path = self._logs / f"{sandbox_id}.log"
            process = await asyncio.to_thread(launch.spawn, command, theirs, directory, log_path)
        except BaseException:
            mine.close()
            await asyncio.to_thread(self._uids.release, uid)
            if placed:  # made here, and no process of it ever started
                await asyncio.to_thread(self.disks.remove, directory)
            raise
        finally:
            theirs.close()  # the process has its own copy
        self.family_join(uid)
        self._namespaces[uid] = process
        channel = frames.Channel(mine, self.settings.max_frame)
        sandbox = LocalSandbox(self, sandbox_id, uid, limits, channel, process)
        sandbox.group = own.parent if own is not None else None
        sandbox.start_reading()
        try:
            nproc = (
                family_nproc(limits.nproc, self.settings.family_max) if fork_ready else limits.nproc
            )
            await channel.send(
                launch.init_frame(
                    limits, fork_ready=fork_ready, output_cap=self.settings.output_cap,
                    max_frame=self.settings.max_frame, nproc=nproc,
                )
            )  # fmt: skip
            await sandbox.wait_ready(self.settings.start_timeout_s)
        except BaseException:
            await sandbox.stop("failed to start", "exited")
            if sandbox.pid is None:  # it never joined as a running member (`LocalSandbox._stop`)
                await self.family_leave(uid)
            raise
        return sandbox

    async def fork(self, parent: LocalSandbox, child_id: str) -> LocalSandbox:
        return await parent.fork_into(child_id)

    async def clone_repo(
        self, box: LocalSandbox, url: str, ref: str | None, *, allow_local: bool
    ) -> None:
        self.disks.reach(box.directory)
        staging = self.settings.root / ".broker" / "clones" / new_id()
        await clone(box.workspace, box.uid, url, ref, allow_local=allow_local, staging=staging)

    def record_uid(self, uid: int, directory: Path) -> None:
        self._uids.record(uid, directory)

    async def discard(self, sandbox_id: str) -> None:
        await asyncio.to_thread(self.disks.remove, self.settings.root / sandbox_id)

    async def close(self) -> None:
        for drop in list(self._drops):  # what is left, the next start's sweep removes
            drop.cancel()
        await asyncio.to_thread(self.disks.unmount_mine)


def end_namespace(holder: "subprocess.Popen[bytes]") -> None:
    """SIGKILL the init of a family's pid namespace, the one child of `holder` (`unshare
    --fork`, which waits for it): its death takes every process in the namespace (a signal
    from an ancestor namespace is the one kind an init cannot ignore). `unshare` reaps it and
    exits; killing `unshare` too would leave the dead init to the host's init to reap."""
    try:
        children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(child), signal.SIGKILL)
    try:
        holder.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)


def _keeps_the_contract(provider: LocalProvider, sandbox: LocalSandbox) -> tuple[Provider, Sandbox]:
    """Never called: mypy checks here that `local` implements the provider contract."""
    return provider, sandbox
