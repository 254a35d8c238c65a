"""The supervisor in-process, with stand-in children (tiny Python programs), no NATS."""

import asyncio
import dataclasses
import os
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import pytest

from fleet_cli.children import ChildSpec, State, backoff_s
from fleet_cli.supervisor import Supervisor
from fleet_harness.waits import eventually

PAUSE = "import signal; signal.pause()"
# Starts a grandchild (same process group), prints its pid, waits: stopping must reach both.
WITH_GRANDCHILD = (
    "import signal, subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'])\n"
    "print(child.pid, flush=True)\n"
    "signal.pause()\n"
)
DEAF = (
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('deaf', flush=True); signal.pause()\n"
)


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a zombie is dead, only not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def spec(tmp_path: Path, name: str, code: str) -> ChildSpec:
    return ChildSpec(
        name=name,
        argv=(sys.executable, "-c", code),
        env={"PATH": os.environ.get("PATH", "/usr/bin")},
        log_path=tmp_path / f"{name}.log",
    )


Watch = Callable[[Supervisor], None]


@pytest.fixture
async def watching() -> AsyncIterator[Watch]:
    """Starts a supervisor and its `watch` loop; stops both when the test ends."""
    stop = asyncio.Event()
    running: list[tuple[Supervisor, asyncio.Task[None]]] = []

    def watch(supervisor: Supervisor) -> None:
        supervisor.start()
        running.append((supervisor, asyncio.create_task(supervisor.watch(stop))))

    yield watch
    stop.set()
    for supervisor, task in running:
        await task
        supervisor.stop()


def test_backoff_restarts_at_once_after_a_healthy_run_then_doubles_up_to_a_cap() -> None:
    assert [backoff_s(n) for n in range(1, 6)] == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert backoff_s(50) == 30.0


async def test_a_child_that_dies_is_restarted_with_a_new_pid(
    tmp_path: Path, watching: Watch
) -> None:
    supervisor = Supervisor([spec(tmp_path, "svc", PAUSE)], grace_s=5)
    watching(supervisor)
    (child,) = supervisor.children
    first = child.pid
    assert first is not None
    os.kill(first, 9)

    def restarted() -> bool:
        view = child.view()
        return view.state is State.RUNNING and view.pid != first and view.restarts == 1

    await eventually(restarted, timeout=10, what="the supervisor to restart the child")
    assert child.view().last_exit == -9
    assert child.pid is not None
    assert alive(child.pid)


async def test_a_crash_loop_backs_off_instead_of_spinning(tmp_path: Path, watching: Watch) -> None:
    supervisor = Supervisor([spec(tmp_path, "crashy", "raise SystemExit(3)")], grace_s=5)
    watching(supervisor)
    (child,) = supervisor.children
    await eventually(lambda: child.restarts >= 2, timeout=10, what="two restarts")
    await eventually(lambda: child.view().state is State.WAITING, timeout=10, what="a backoff wait")
    assert child.last_exit == 3
    assert child.restart_at is not None
    assert child.failures >= 3


async def test_stop_terminates_every_group_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    specs = [spec(tmp_path, "parent", WITH_GRANDCHILD), spec(tmp_path, "deaf", DEAF)]
    supervisor = Supervisor(specs, grace_s=0.5)
    supervisor.start()
    parent, deaf = supervisor.children
    log = specs[0].log_path
    grandchild = int(
        await eventually(lambda: log.read_text().strip(), timeout=10, what="grandchild pid")
    )
    await eventually(
        lambda: "deaf" in specs[1].log_path.read_text(), timeout=10, what="SIGTERM ignored"
    )
    pids = [parent.pid, deaf.pid, grandchild]
    supervisor.stop()
    assert [alive(pid) for pid in pids if pid is not None] == [False, False, False]
    assert deaf.process is not None
    assert deaf.process.returncode == -9
    assert [view.state for view in supervisor.views()] == [State.STOPPED, State.STOPPED]


# Ignores SIGTERM and holds 200 MB: the SIGKILL at the end of a stop takes the kernel tens of
# milliseconds to carry out (it frees the memory first), the window in which any straggler on
# a loaded machine is still running.
STRAGGLER = (
    "import signal\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "held = b'x' * (200 * 2**20)\n"
    "print('held', flush=True)\n"
    "signal.pause()\n"
)
# Starts the straggler (same process group), prints its pid once it holds its memory, and dies
# of the first SIGTERM.
LEADS_A_STRAGGLER = (
    "import signal, subprocess, sys\n"
    f"child = subprocess.Popen([sys.executable, '-c', {STRAGGLER!r}], stdout=subprocess.PIPE)\n"
    "child.stdout.readline()\n"
    "print(child.pid, flush=True)\n"
    "signal.pause()\n"
)


async def test_stop_returns_only_once_a_straggler_it_killed_is_gone(tmp_path: Path) -> None:
    """The leader dies of SIGTERM, its child ignores it and gets the group's SIGKILL. `fleet up`
    promises nothing is left once it exits, so stop must not return while that child is still
    exiting: on a loaded machine 11 of 60 stops returned with a straggler still running."""
    leader = spec(tmp_path, "leader", LEADS_A_STRAGGLER)
    supervisor = Supervisor([leader], grace_s=5)
    supervisor.start()
    straggler = int(
        await eventually(lambda: leader.log_path.read_text().strip(), timeout=10, what="its pid")
    )
    supervisor.stop()
    assert not alive(straggler)


# On SIGTERM, print the (system-wide) monotonic clock, then exit.
TERM_CLOCK = (
    "import signal, sys, time\n"
    "def bye(*_):\n"
    "    print(time.monotonic(), flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('up', flush=True)\n"
    "while True:\n"
    "    signal.pause()\n"
)


async def test_stop_ends_the_services_before_what_is_marked_stop_last(tmp_path: Path) -> None:
    nats_like = dataclasses.replace(spec(tmp_path, "nats", TERM_CLOCK), stop_last=True)
    service = spec(tmp_path, "svc", TERM_CLOCK)
    supervisor = Supervisor([nats_like, service], grace_s=5)
    supervisor.start()
    for s in (nats_like, service):
        await eventually(partial(_logged_up, s.log_path), timeout=10, what=s.name)
    supervisor.stop()
    service_exit = float(service.log_path.read_text().split()[-1])
    nats_term = float(nats_like.log_path.read_text().split()[-1])
    assert service_exit < nats_term


def _logged_up(log_path: Path) -> bool:
    return "up" in log_path.read_text()
