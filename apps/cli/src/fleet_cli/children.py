"""One supervised child process: its own process group, its log file, its restart backoff.

The group matters: a service may start processes of its own (sandboxes), and stopping the
service must stop them too, so every signal goes to the whole group.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO

# A child that stays up this long is healthy again: its next crash restarts it at once.
HEALTHY_AFTER_S = 10.0
# After a stop's SIGKILL to a group: how long to wait for the kernel to end what it hit.
GROUP_EXIT_S = 5.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


def backoff_s(consecutive_failures: int) -> float:
    """0 for the first crash after a healthy run, then 0.5 s, 1 s, 2 s, ... up to 30 s."""
    if consecutive_failures <= 1:
        return 0.0
    return float(min(FIRST_BACKOFF_S * 2 ** (consecutive_failures - 2), MAX_BACKOFF_S))


class State(StrEnum):
    RUNNING = "running"
    WAITING = "restarting"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    log_path: Path
    stop_last: bool = False  # NATS: stopped only after every service has gone


def orphan_guard() -> tuple[str, ...]:
    """An argv prefix so that a child gets SIGTERM if `fleet up` dies without stopping it
    (SIGKILL, OOM killer): `setpriv --pdeathsig` (util-linux) sets it, then execs the child,
    which keeps its pid. The signal follows the *thread* that started the child: every child
    is started from the event loop's thread, which lives as long as the process."""
    setpriv = shutil.which("setpriv")
    return (setpriv, "--pdeathsig", "TERM", "--") if setpriv else ()


@dataclass(frozen=True)
class ChildView:
    """What the status table shows; equal views mean nothing worth reprinting happened."""

    name: str
    state: State
    pid: int | None
    restarts: int
    last_exit: int | None


@dataclass
class Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    failures: int = 0
    last_exit: int | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    stopping: bool = False
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = open(self.spec.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            (*orphan_guard(), *self.spec.argv),
            env=self.spec.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started_at = time.monotonic()
        self.restart_at = None

    def exited(self, now: float) -> int | None:
        """If the child died since the last look, note it, schedule its restart, return rc."""
        if self.stopping or self.process is None or self.restart_at is not None:
            return None
        rc = self.process.poll()
        if rc is None:
            return None
        self._signal_group(signal.SIGKILL)  # whatever it started dies with it
        self.last_exit = rc
        self.failures = 1 if now - self.started_at >= HEALTHY_AFTER_S else self.failures + 1
        self.restart_at = now + backoff_s(self.failures)
        return rc

    def due(self, now: float) -> bool:
        return not self.stopping and self.restart_at is not None and now >= self.restart_at

    def restart(self) -> None:
        self.restarts += 1
        self.start()

    def view(self) -> ChildView:
        if self.stopping or self.process is None:
            state = State.STOPPED
        elif self.restart_at is not None:
            state = State.WAITING
        else:
            state = State.RUNNING
        return ChildView(self.spec.name, state, self.pid, self.restarts, self.last_exit)

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):  # the group is already empty
            os.killpg(self.process.pid, sig)

    def terminate(self) -> None:
        """Ask the whole group to stop (first half of `stop`)."""
        self.stopping = True
        self._signal_group(signal.SIGTERM)

    def finish(self, deadline: float) -> int | None:
        """Wait for the leader until `deadline`, then SIGKILL the group, stragglers included."""
        rc: int | None = None
        if self.process is not None:
            try:
                rc = self.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                rc = self.process.wait(10)
            self._signal_group(signal.SIGKILL)
            _wait_group_ended(self.process.pid, time.monotonic() + GROUP_EXIT_S)
        if self._log is not None:
            self._log.close()
            self._log = None
        return rc


def _wait_group_ended(pgid: int, deadline: float) -> None:
    """SIGKILL only asks: a killed process runs on until the kernel has carried out its exit
    (freeing its memory first), which a loaded machine may take a while to schedule. A stop
    that returned then would leave a straggler running as `fleet up` exits (it promises to
    leave no process behind), so wait for the group to end, up to `deadline`."""
    while _group_running(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _group_running(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs. A zombie has ended (only its parent has
    not reaped it yet), and an orphan's new parent may never reap it."""
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # ended while we looked
                continue
            state, _, group = stat.rsplit(")", 1)[1].split()[:3]
            if int(group) == pgid and state != "Z":
                return True
    return False
