"""Unprivileged uids for sandboxes: one per fork family, claimed host-wide.

A claim is a held `flock` on `<locks>/<uid>.lock`, shared by every broker on the host, so a
dead broker's uids free themselves. Claiming and releasing a uid sweep its processes:
`kill(-1)` run as that uid reaches exactly them, strays that left the sandbox's group included.
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

    def claim(self) -> int:
        with self._lock:
            return self._claim()

    def _claim(self) -> int:
        for _ in range(self._count):
            uid = self._base + self._next
            self._next = (self._next + 1) % self._count
            if uid in self._held:
                continue
            fd = os.open(self._dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._held[uid] = fd
            sweep_uid(uid)  # strays from a broker that died holding this uid
            return uid
        raise SandboxError(f"all {self._count} sandbox uids are in use")

    def release(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid, None)
        if fd is not None:
            sweep_uid(uid)
            os.close(fd)


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
    """Give a tree to `uid` without following links (a revived sandbox gets a new uid)."""
    os.chown(path, uid, uid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


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
