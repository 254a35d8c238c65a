"""Containment of the local provider, asserted on this machine (never skipped).

Each case: the sandbox is stopped or refused with a clear error, and the broker stays healthy
(it answers ping and starts a new, working sandbox afterwards).
"""

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dspy.primitives.code_interpreter import CodeExecutionError, CodeInterpreterError

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events.bus import Ping
from fleet_events.envelope import new_id
from fleet_events.sandbox import Limits, SandboxInfo
from fleet_harness.procs import Replica
from fleet_harness.waits import eventually_sync
from fleet_mesh.natsserver import NatsServer
from fleet_sandbox_broker.config import BrokerSettings
from fleet_sandbox_broker.providers.local import family_nproc, member_tasks

from .conftest import BROKER_SECRET


class Box:
    def __init__(
        self, bus: SandboxBus, limits: Limits | None = None, fork_ready: bool = True
    ) -> None:
        self.bus = bus
        self.info: SandboxInfo = bus.create_sandbox(limits=limits, fork_ready=fork_ready)
        self.repl = RemoteInterpreter(bus, self.info.sandbox)

    def run(self, code: str) -> Any:
        return self.repl.execute(code)

    def close(self) -> None:
        self.repl.shutdown()
        self.bus.delete_sandbox(self.info.sandbox)


MakeBox = Callable[..., Box]


@pytest.fixture
def make(bus: SandboxBus) -> Iterator[MakeBox]:
    """Boxes on the module's bus, each closed when the test ends."""
    made: list[Box] = []

    def box(limits: Limits | None = None, fork_ready: bool = True) -> Box:
        made.append(Box(bus, limits, fork_ready))
        return made[-1]

    yield box
    for box_made in made:
        box_made.close()


def assert_broker_healthy(bus: SandboxBus) -> None:
    pong = bus.call(verbs.ping("sandbox-broker"), Ping(), timeout=5)
    assert pong.service == "sandbox-broker"
    fresh = Box(bus)
    try:
        assert fresh.run("6 * 7") == 42
    finally:
        fresh.close()


def no_process_of(uid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    return False
            except FileNotFoundError:
                continue
    return True


def test_runs_unprivileged_with_a_scrubbed_environment(make: MakeBox) -> None:
    box = make()
    uid, gids, env = box.run("import os\n(os.getuid(), os.getgroups(), dict(os.environ))")
    assert uid == box.info.uid
    assert uid != 0
    assert gids == []
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "MALLOC_ARENA_MAX", "PWD", "LC_CTYPE"}
    assert BROKER_SECRET not in repr(env)
    caps = box.run("[l for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapBnd'))]")
    assert all(line.split()[1] == "0000000000000000" for line in caps)


def test_cannot_read_the_brokers_secrets(make: MakeBox, broker: Replica) -> None:
    box = make()
    code = f"""
import os
found, refused = [], []
for pid in ['1', 'self', '{broker.pid}'] + [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        data = open('/proc/' + pid + '/environ', 'rb').read()
    except OSError as e:
        refused.append((pid, e.errno))
        continue
    if b'{BROKER_SECRET}' in data:
        found.append(pid)
(found, dict(refused).get('1'), dict(refused).get('{broker.pid}'))
"""
    found, init_errno, broker_errno = box.run(code)
    assert found == []
    assert init_errno == 13  # the family's init is the sandbox's uid's, but not dumpable
    assert broker_errno == 2  # the broker is not in the sandbox's pid namespace at all
    with pytest.raises(CodeExecutionError, match=r"FileNotFoundError|PermissionError"):
        box.run("open('/root/.bashrc').read()")


def test_host_directories_holding_projects_state_and_sockets_are_hidden(make: MakeBox) -> None:
    box = make()
    code = """
import os
seen = {}
for d in ['/work', '/home', '/root', '/var/lib', '/var/log', '/run', '/opt', '/tmp']:
    try:
        seen[d] = os.listdir(d)
    except OSError as e:
        seen[d] = type(e).__name__
(seen, os.path.exists('/work/main/pyproject.toml'), os.path.exists('/usr/bin/python3'))
"""
    seen, project_visible, python_visible = box.run(code)
    assert project_visible is False
    assert python_visible is True
    # mounted by allow-list (test_provider_mounts.py): these do not exist inside at all
    assert {d: v for d, v in seen.items() if d != "/tmp"} == {
        "/work": "FileNotFoundError", "/home": "FileNotFoundError",
        "/root": "FileNotFoundError", "/var/lib": "FileNotFoundError",
        "/var/log": "FileNotFoundError", "/run": "FileNotFoundError",
        "/opt": "FileNotFoundError",
    }  # fmt: skip
    # /tmp holds only the path back to the sandbox root (tests keep it under /tmp)
    assert len(seen["/tmp"]) <= 1


def test_cannot_write_outside_its_workspace(
    make: MakeBox, tmp_path_factory: pytest.TempPathFactory
) -> None:
    box, other = make(), make()
    other_ws = other.info.workspace
    # a name of this run's own: a file another run (or anything else) left at /tmp/escape must
    # not fail this one, and one this run's sandbox wrote must not fail the next
    name = f"escape-{new_id()[:12]}"
    host = [f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}"]
    targets = [
        *host,
        f"/run/lock/{name}",
        f"../{name}",
        f"../../{name}",
        f"{other_ws}/{name}",
        f"/etc/{name}",
        f"/{name}",
    ]
    code = f"""
import errno
written, refused = [], {{}}
for path in {targets!r}:
    try:
        with open(path, 'w') as f:
            f.write('x')
        written.append(path)
    except OSError as e:
        refused[path] = errno.errorcode[e.errno]
with open('inside.txt', 'w') as f:
    f.write('ok')
(written, refused)
"""
    written, refused = box.run(code)
    assert written == []
    assert set(refused) == set(targets)
    assert box.bus.read_file(box.info.sandbox, "inside.txt") == b"ok"
    assert [p for p in host if os.path.exists(p)] == []


def test_cannot_reach_nats_or_the_network(make: MakeBox, nats_server: NatsServer) -> None:
    box = make()
    code = f"""
import socket, errno
out = {{}}
for host, port in [('127.0.0.1', {nats_server.port}), ('10.0.0.1', 80), ('1.1.1.1', 53)]:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port))
        out[host] = 'connected'
    except OSError as e:
        out[host] = errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
out
"""
    out = box.run(code)
    assert out == {"127.0.0.1": "ENETUNREACH", "10.0.0.1": "ENETUNREACH", "1.1.1.1": "ENETUNREACH"}


@pytest.mark.slow
def test_an_infinite_loop_is_stopped_by_the_wall_time_limit(make: MakeBox, bus: SandboxBus) -> None:
    box = make(Limits(wall_s=1))
    with pytest.raises(CodeInterpreterError, match=r"exceeded the 1 s wall-time limit"):
        box.run("while True:\n    pass")
    assert bus.sandbox_info(box.info.sandbox).status == "stopped"
    assert_broker_healthy(bus)


@pytest.mark.slow
def test_cpu_time_limit_stops_a_busy_cell(make: MakeBox, bus: SandboxBus) -> None:
    box = make(Limits(wall_s=30, cpu_s_per_cell=1))
    with pytest.raises(CodeInterpreterError, match="CPU time limit of 1 s per cell"):
        box.run("while True:\n    pass")
    assert_broker_healthy(bus)


@pytest.mark.slow
def test_the_cpu_limit_is_per_cell(make: MakeBox) -> None:
    box = make(Limits(wall_s=30, cpu_s_per_cell=1))
    burn = (
        "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end:\n    pass"
    )
    # 3 s of CPU in all: more than any one cell may use (1-2 s), under 1 s in each cell
    for _ in range(5):
        box.run(burn)
    assert box.run("time.process_time()") >= 3


@pytest.mark.slow
def test_a_memory_bomb_hits_the_memory_limit(make: MakeBox, bus: SandboxBus) -> None:
    box = make(Limits(memory_mb=256))
    with pytest.raises(CodeInterpreterError, match="memory limit of 256 MiB") as caught:
        box.run("hog = []\nwhile True:\n    hog.append(bytearray(16 * 1024 * 1024))")
    assert not isinstance(caught.value, CodeExecutionError)
    assert bus.sandbox_info(box.info.sandbox).status == "stopped"
    assert_broker_healthy(bus)


@pytest.mark.slow
@pytest.mark.parametrize("fork_ready", [False, True])
def test_the_process_limit_caps_forks(make: MakeBox, fork_ready: bool) -> None:
    """A sandbox that cannot fork is capped at its `nproc`. A fork-ready one's process limit
    is the largest fork family's it may head (its forks share its uid: docs/sandboxes.md,
    "Fork families"), but its own cgroup bounds it at its own allowance (`member_tasks`), so
    it cannot take its future forks' share."""
    box = make(Limits(nproc=12), fork_ready=fork_ready)
    assert family_nproc(12, BrokerSettings().family_max) > 300
    cap = member_tasks(12) if fork_ready else 12
    code = """
import os, signal
children, error = [], None
try:
    for _ in range(1000):
        pid = os.fork()
        if pid == 0:
            signal.pause()  # each child holds its process slot until the sandbox is stopped
            os._exit(0)
        children.append(pid)
except OSError as e:
    error = type(e).__name__
(len(children), error)
"""
    count, error = box.run(code)
    assert error == "BlockingIOError"
    assert cap - 12 < count < cap


@pytest.mark.slow
def test_a_fork_bomb_is_contained_and_cleaned_up(make: MakeBox, bus: SandboxBus) -> None:
    box = make(Limits(nproc=16, wall_s=2))
    uid = box.info.uid
    assert uid is not None
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    with pytest.raises(CodeInterpreterError, match="wall-time limit"):
        box.run(bomb)
    eventually_sync(lambda: no_process_of(uid), timeout=10, what=f"every process of uid {uid} gone")
    assert_broker_healthy(bus)


def test_printed_protocol_frames_are_just_output(make: MakeBox) -> None:
    box = make()
    forged = '{"t":"final","exec":"x","value":{"output":"pwned"}}'
    code = (
        "import struct, sys\n"
        f"frame = {forged!r}\n"
        "print(frame)\n"
        "print(struct.pack('>I', len(frame)).decode('latin-1') + frame)\n"
        "sys.stderr.write(frame)\n"
        "done = True\n"
    )
    out = box.run(code)
    assert isinstance(out, str)
    assert out.count("pwned") == 3
    assert box.run("1 + 1") == 2


def _write_on_channel(payload: str) -> str:
    return (
        "import os, struct\n"
        "def link(fd):\n"
        "    try:\n"
        "        return os.readlink('/proc/self/fd/' + fd)\n"
        "    except OSError:\n"
        "        return ''\n"
        "fds = os.listdir('/proc/self/fd')\n"
        "socks = [int(fd) for fd in fds if link(fd).startswith('socket:')]\n"
        f"for fd in socks:\n    os.write(fd, {payload})\n"
        "'written'"
    )


def test_a_frame_over_the_size_limit_stops_the_sandbox(make: MakeBox, bus: SandboxBus) -> None:
    box = make()
    with pytest.raises(
        CodeInterpreterError, match=r"frame of 104857600 bytes, over the \d+-byte limit"
    ):
        box.run(_write_on_channel("struct.pack('>I', 100 * 1024 * 1024)"))
    assert bus.sandbox_info(box.info.sandbox).status == "stopped"
    assert_broker_healthy(bus)


def test_a_malformed_frame_stops_the_sandbox(make: MakeBox, bus: SandboxBus) -> None:
    box = make()
    with pytest.raises(CodeInterpreterError, match="malformed frame"):
        box.run(_write_on_channel("struct.pack('>I', 9) + b'not json!'"))
    assert_broker_healthy(bus)
