"""Unprivileged uids for sandboxes: one per fork family, claimed host-wide.

A claim is a held `flock` on `<locks>/<uid>.lock`, shared by every broker on the host, so a
dead broker's uids free themselves. Claiming and releasing a uid sweep its processes:
`kill(-1)` run as that uid reaches exactly them, strays that left the sandbox's group included.

A free lock is not enough: a sandbox's files outlive its processes (a stopped sandbox not yet
deleted, a broker killed before it discarded its sandboxes), and whoever gets the uid next can
read and write them. So `<locks>/<uid>.dirs` records each sandbox directory the uid was given
to, and a uid is skipped while one of those still exists and is still its own. A provider
starting on a root records what it finds there (the locks live on a tmpfs: after a reboot the
records are gone, the directories are not).
"""

import fcntl
import os
import subprocess
import threading
from pathlib import Path

from fleet_sandbox_broker.errors import SandboxError


class UidPool:
    """A uid per fork family. A claim is a held flock, so a dead broker's uids free themselves."""

    def __init__(self, directory: Path, base: int, count: int) -> None:
        self._dir = directory
        self._base = base
        self._count = count
        self._held: dict[int, int] = {}
        self._next = 0
        self._lock = threading.Lock()  # claims and releases run in worker threads

    def claim(self, directory: Path) -> int:
        """A uid for the sandbox at `directory`, recorded as given to it. A uid whose only
        files left are `directory`'s own (a revive) may be taken again."""
        with self._lock:
            return self._claim(directory)

    def _claim(self, directory: Path) -> int:
        held = tainted = 0
        for _ in range(self._count):
            uid = self._base + self._next
            self._next = (self._next + 1) % self._count
            if uid in self._held:
                held += 1
                continue
            fd = os.open(self._dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                held += 1
                continue
            if owned_dirs(self._dir, uid) - {str(directory)}:
                os.close(fd)
                tainted += 1
                continue
            self._held[uid] = fd
            _write_record(self._dir, uid, {str(directory)})
            sweep_uid(uid)  # strays from a broker that died holding this uid
            return uid
        raise SandboxError(
            f"no sandbox uid is free: {held} of {self._count} are in use and {tainted} still "
            "own files of sandboxes that were never discarded; discard those sandboxes or "
            "raise the uid count"
        )

    def record(self, uid: int, directory: Path) -> None:
        """`directory` is given to `uid` too (a fork: one uid per family)."""
        with self._lock:
            _write_record(self._dir, uid, owned_dirs(self._dir, uid) | {str(directory)})

    def record_leftovers(self, root: Path) -> None:
        """Record sandbox directories under `root` whose files a pool uid owns."""
        with self._lock:
            found: dict[int, set[str]] = {}
            with os.scandir(root) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    uid = _owner(Path(entry.path))
                    if uid is not None and self._base <= uid < self._base + self._count:
                        found.setdefault(uid, set()).add(entry.path)
            for uid, dirs in found.items():
                _write_record(self._dir, uid, owned_dirs(self._dir, uid) | dirs)

    def release(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid, None)
        if fd is not None:
            sweep_uid(uid)
            os.close(fd)


def owned_dirs(locks: Path, uid: int) -> set[str]:
    """The recorded sandbox directories of `uid` that still exist and are still its own (a
    revive hands a directory to a new uid)."""
    try:
        recorded = (locks / f"{uid}.dirs").read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {d for d in recorded if d and _owner(Path(d)) == uid}


def _owner(directory: Path) -> int | None:
    """Who owns a sandbox directory's files: its workspace's owner (chown_tree hands the
    workspace over last, so a half-done hand-over still names the old uid)."""
    for sub in ("workspace", "tmp"):
        try:
            return os.lstat(directory / sub).st_uid
        except OSError:
            continue
    return None


def _write_record(locks: Path, uid: int, dirs: set[str]) -> None:
    path = locks / f"{uid}.dirs"
    if not dirs:
        path.unlink(missing_ok=True)
        return
    scratch = locks / f"{uid}.dirs.new"
    scratch.write_text("".join(f"{d}\n" for d in sorted(dirs)))
    os.replace(scratch, path)


def sweep_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (kill(-1) as that uid reaches exactly those)."""
    subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "kill", "-9", "-1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
        timeout=10,
    )


def chown_tree(path: Path, uid: int) -> None:
    """Give a tree to `uid` without following links (a revived sandbox gets a new uid). The
    top goes last: its owner says the whole tree was handed over (`owned_dirs`)."""
    for dirpath, dirnames, filenames in os.walk(path, topdown=False, followlinks=False):
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
    os.chown(path, uid, uid, follow_symlinks=False)


def sweep_orphans(directory: Path, base: int, count: int) -> list[int]:
    """SIGKILL the processes of pool uids that no live broker holds; returns those uids.

    A broker that died (SIGKILL, OOM) leaves its sandboxes' processes running, daemonised
    strays included, until their uid is claimed again. A starting broker sweeps them at once.
    """
    running: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uid = entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue  # exited meanwhile
            if base <= uid < base + count:
                running.add(uid)
    directory.mkdir(parents=True, exist_ok=True)
    swept = []
    for uid in sorted(running):
        fd = os.open(directory / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live broker on this host holds it
            sweep_uid(uid)
            swept.append(uid)
        finally:
            os.close(fd)  # releases the lock
    return swept
