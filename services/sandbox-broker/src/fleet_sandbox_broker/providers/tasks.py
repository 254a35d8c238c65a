"""The host's bound on sandbox tasks: every local sandbox process, of every broker on the
host, joins one pids cgroup at start, and the kernel refuses a fork past its `pids.max`.

Each fork family is bounded already (its uid's `RLIMIT_NPROC`, `local.family_nproc`); this
bounds them together, so fork bombs in many families (one tenant's, or several) stop at the
cgroup's limit, by default half the kernel's `pid_max`, and the services and the host keep
the other half. The cgroup is found in the pids hierarchy (cgroup v1, `/sys/fs/cgroup/pids`)
or the unified one (v2, with the pids controller enabled for its children); where neither can
be written (no root, no delegation) there is no host bound, and the broker says so at start.
"""

import contextlib
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

V1 = Path("/sys/fs/cgroup/pids")
V2 = Path("/sys/fs/cgroup")
PID_MAX = Path("/proc/sys/kernel/pid_max")


@dataclass(frozen=True)
class TaskBound:
    procs: Path | None
    """The cgroup's `cgroup.procs`, which a sandbox's first process writes itself into (None:
    no cgroup, `why` says why)."""
    limit: int
    why: str = ""


def host_bound(name: str, limit: int, *, v1: Path = V1, v2: Path = V2) -> TaskBound:
    """The cgroup `name` with `pids.max` = `limit` (0: half of `pid_max`), made if missing;
    an empty name turns the bound off."""
    if not name:
        return TaskBound(None, 0, "turned off (FLEET_SANDBOX_TASK_CGROUP is empty)")
    if limit <= 0:
        limit = max(1, int(PID_MAX.read_text()) // 2)
    root = _pids_root(v1, v2)
    if root is None:
        return TaskBound(None, 0, f"no writable pids cgroup hierarchy at {v1} or {v2}")
    group = root / name
    try:
        group.mkdir(exist_ok=True)
        (group / "pids.max").write_text(str(limit))
    except OSError as exc:
        return TaskBound(None, 0, f"cannot set up the pids cgroup {group}: {exc.strerror}")
    subtree = group / "cgroup.subtree_control"  # v2: members' own limits need it enabled
    if subtree.exists():
        with contextlib.suppress(OSError):  # refused while the group holds processes itself
            subtree.write_text("+pids")
    return TaskBound(group / "cgroup.procs", limit)


def _pids_root(v1: Path, v2: Path) -> Path | None:
    if (v1 / "cgroup.procs").exists():
        return v1
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "pids" in controllers.read_text().split():
        try:  # the children of the root count tasks only with the controller enabled for them
            (v2 / "cgroup.subtree_control").write_text("+pids")
        except OSError:
            return None
        return v2
    return None


def joining(procs: Path | None, command: list[str]) -> list[str]:
    """`command`, started by a shell that first moves itself into the cgroup whose
    `cgroup.procs` is `procs` (so every process it becomes or starts is counted there from its
    first instruction)."""
    if procs is None:
        return command
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *command]


# -- one member's own bound -------------------------------------------------------------------
#
# Inside the host's cgroup each sandbox (each member of a fork family) has a cgroup of its own,
# `<host group>/<sandbox id>`, whose `pids.max` is the member's own allowance: one member's fork
# bomb stops there and leaves its parent and siblings the rest of the family's process limit
# (L6). A root sandbox's process joins its own at start; a fork, made inside its parent (so in
# the parent's cgroup), is moved into its own by the broker once it reports its pid, while it
# still idles. Where there is no host cgroup there are no member cgroups either (`why`).


FAMILY_TASKS = 4
"""Tasks one member of a fork family holds on its own: the sandbox's process, its cell
thread, its checkpoint copy and a retiring copy (measured: 3, one spare)."""


def member_tasks(nproc: int) -> int:
    """One member's own bound on tasks (its cgroup's `pids.max`, `tasks.member_group`): the
    allowance of its code and its own tasks. A member's fork bomb stops there, the family's
    process limit keeps room for every other member's."""
    return nproc + FAMILY_TASKS


def member_group(
    bound: TaskBound, sandbox_id: str, limit: int, under: Path | None = None
) -> Path | None:
    """`<under>/<sandbox_id>` (`under`: a tenant's group, or the host group itself) with
    `pids.max` = `limit`, made; its `cgroup.procs` (None: no host cgroup, or it cannot be made:
    the member draws on the groups above it only)."""
    if bound.procs is None:
        return None
    group = (under or bound.procs.parent) / sandbox_id
    try:
        group.mkdir(exist_ok=True)
        (group / "pids.max").write_text(str(limit))
    except OSError:
        return None
    return group / "cgroup.procs"


# -- a tenant's bound ---------------------------------------------------------------------------
#
# Between the host's group and its members, each tenant has a group of its own,
# `<host group>/tenant-<name>`, whose `pids.max` bounds all of that tenant's sandboxes
# together: one tenant's bombs fill its own bound, never the host's, and other tenants' sandboxes
# keep starting tasks. A pooled sandbox belongs to no tenant when it starts (its member group is
# right under the host's); it is moved under its tenant's when the broker hands it out
# (`LocalSandbox.bind_tenant`), its forks are made under their parent's tenant.

TENANT_PREFIX = "tenant-"
_PLAIN_TENANT = re.compile(r"[A-Za-z0-9_-]{1,64}")


def tenant_group(bound: TaskBound, tenant: str, limit: int) -> Path | None:
    """The group of `tenant`'s sandboxes with `pids.max` = `limit`, made (None: no host
    cgroup, or it cannot be made)."""
    if bound.procs is None:
        return None
    name = (
        tenant
        if _PLAIN_TENANT.fullmatch(tenant)
        else hashlib.sha256(tenant.encode()).hexdigest()[:32]
    )
    group = bound.procs.parent / f"{TENANT_PREFIX}{name}"
    try:
        group.mkdir(exist_ok=True)
        (group / "pids.max").write_text(str(limit))
    except OSError:
        return None
    subtree = group / "cgroup.subtree_control"  # v2, as the host group
    if subtree.exists():
        with contextlib.suppress(OSError):
            subtree.write_text("+pids")
    return group


def move_group(old: Path, new: Path) -> bool:
    """Move every process of the cgroup `old` (its `cgroup.procs`) into `new`, then remove
    `old`; False when the kernel refused a move (those stay where they were)."""
    try:
        pids = (old / "cgroup.procs").read_text().split()
    except OSError:
        return False
    moved = True
    for pid in pids:
        try:
            (new / "cgroup.procs").write_text(pid)
        except ProcessLookupError:
            continue
        except OSError:
            moved = False
    with contextlib.suppress(OSError):
        old.rmdir()
    return moved


def move_into(procs: Path, pid: int) -> bool:
    """Move `pid` and every process below it into the cgroup of `procs` (cgroup v1 and v2
    both move a whole thread group per write); False when the kernel refused one."""
    moved = True
    for each in [pid, *_descendants(pid)]:
        try:
            procs.write_text(str(each))
        except ProcessLookupError:
            continue  # gone meanwhile: nothing left to bound
        except OSError:
            moved = False
    return moved


def drop_member(procs: Path | None) -> bool:
    """Remove a member's cgroup once its processes are gone (False while some remain)."""
    if procs is None:
        return True
    try:
        procs.parent.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


STALE_MEMBER_S = 60.0


def sweep_members(bound: TaskBound, now: float) -> int:
    """Remove member cgroups left empty by brokers that died (a SIGKILL leaves them): only
    those older than `STALE_MEMBER_S`, so a member made a moment ago by another broker on the
    host, whose process is about to join it, is never taken from under it. Returns how many."""
    if bound.procs is None:
        return 0
    return _sweep(bound.procs.parent, now)


def _sweep(group: Path, now: float) -> int:
    removed = 0
    try:
        entries = list(os.scandir(group))
    except OSError:
        return 0
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.name.startswith(TENANT_PREFIX):  # its members first
                removed += _sweep(Path(entry.path), now)
            if now - entry.stat(follow_symlinks=False).st_mtime < STALE_MEMBER_S:
                continue
            os.rmdir(entry.path)  # refused while a process (or a member group) is in it
            removed += 1
        except OSError:
            continue
    return removed


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                kids = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for kid in kids:
                found.append(int(kid))
                stack.append(int(kid))
    return found


__all__ = [
    "FAMILY_TASKS", "TaskBound", "drop_member", "host_bound", "joining", "member_group",
    "member_tasks", "move_group", "move_into", "sweep_members", "tenant_group",
]  # fmt: skip
