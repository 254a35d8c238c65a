"""The host's bound on sandbox tasks: every local sandbox process, of every broker on the
host, joins one pids cgroup at start, and the kernel refuses a fork past its `pids.max`.

Each fork family is bounded already (its uid's `RLIMIT_NPROC`, `local.family_nproc`); this
bounds them together, so fork bombs in many families (one tenant's, or several) stop at the
cgroup's limit, by default half the kernel's `pid_max`, and the services and the host keep
the other half. The cgroup is found in the pids hierarchy (cgroup v1, `/sys/fs/cgroup/pids`)
or the unified one (v2, with the pids controller enabled for its children); where neither can
be written (no root, no delegation) there is no host bound, and the broker says so at start.
"""

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


def joining(bound: TaskBound, command: list[str]) -> list[str]:
    """`command`, started by a shell that first moves itself into the cgroup (so every process
    it becomes or starts is counted there from its first instruction)."""
    if bound.procs is None:
        return command
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(bound.procs), *command]


__all__ = ["TaskBound", "host_bound", "joining"]
