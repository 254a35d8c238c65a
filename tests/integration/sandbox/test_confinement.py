"""Attacks from the hostile-tenant review (issue 28) replayed against a real `LocalProvider`:
the kernel surface a sandbox may reach (seccomp), what its `/proc` shows (a pid namespace per
fork family). Each failed before the fix: a vsock socket opened, io_uring and bpf answered
EFAULT/EINVAL (reachable), a user namespace could be made, and `/proc` listed every process
on the host."""

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleet_sandbox_broker.providers.local import LocalProvider

from .provider_kit import LIMITS, provider, run, uid_block, value

UID_BASE = uid_block(361400)

PROBE = """
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    numbers = {'x86_64': {'io_uring_setup': 425, 'bpf': 321, 'perf_event_open': 298,
                          'keyctl': 250, 'ptrace': 101, 'unshare': 272, 'mount': 165},
               'aarch64': {'io_uring_setup': 425, 'bpf': 280, 'perf_event_open': 241,
                           'keyctl': 219, 'ptrace': 117, 'unshare': 97, 'mount': 40}}
    nr = numbers[os.uname().machine][name]
    ctypes.set_errno(0)
    result = libc.syscall(nr, *args)
    return errno.errorcode.get(ctypes.get_errno(), 'OK') if result < 0 else 'OK'
def sock(family, kind=socket.SOCK_STREAM):
    try:
        socket.socket(family, kind).close()
        return 'OK'
    except OSError as e:
        return errno.errorcode.get(e.errno)
found = {
    'vsock': sock(40),
    'netlink': sock(16, socket.SOCK_RAW),
    'packet': sock(17, socket.SOCK_RAW),
    'io_uring_setup': call('io_uring_setup', 1, None),
    'bpf': call('bpf', 9999, None, 0),
    'perf_event_open': call('perf_event_open', None, 0, -1, -1, 0),
    'keyctl': call('keyctl', 0, 0),
    'ptrace_attach_init': call('ptrace', 0x4206, 1, 0, 0),
    'user_namespace': call('unshare', 0x10000000),
    'mount': call('mount', b'none', b'/tmp', b'tmpfs', 0, None),
}
status = dict(l.split(':', 1) for l in open('/proc/self/status'))
found['seccomp'] = status['Seccomp'].strip()
found['unix'] = sock(socket.AF_UNIX)
found['inet'] = sock(socket.AF_INET)
found
"""


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    async with provider(tmp_path, UID_BASE) as made:
        yield made


@pytest.mark.parametrize("fork_ready", [True, False])
async def test_kernel_surface_beyond_the_sandbox_is_refused_with_eperm(
    local: LocalProvider, fork_ready: bool
) -> None:
    box = await local.create("probe", LIMITS, fork_ready=fork_ready)
    found = value(await run(box, PROBE))
    assert found == {
        "vsock": "EPERM", "netlink": "EPERM", "packet": "EPERM", "io_uring_setup": "EPERM",
        "bpf": "EPERM", "perf_event_open": "EPERM", "keyctl": "EPERM",
        "ptrace_attach_init": "EPERM", "user_namespace": "EPERM", "mount": "EPERM",
        "seccomp": "2", "unix": "OK", "inet": "OK",
    }  # fmt: skip
    # a denied call is an error, never a kill: the sandbox answers on
    assert value(await run(box, "6 * 7")) == 42
    await box.destroy()


async def test_a_fork_and_a_subprocess_are_confined_too(local: LocalProvider) -> None:
    parent = await local.create("parent", LIMITS)
    assert value(await run(parent, "1")) == 1
    child = await local.fork(parent, "child")
    assert value(await run(child, PROBE))["vsock"] == "EPERM"
    code = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import socket; socket.socket(40, 1)'],"
        " capture_output=True, text=True).stderr.strip().splitlines()[-1]"
    )
    assert value(await run(child, code)) == "PermissionError: [Errno 1] Operation not permitted"
    for box in (child, parent):
        await box.destroy()


LIST_PROC = """
import os
seen = {}
for entry in os.listdir('/proc'):
    if entry.isdigit():
        try:
            seen[int(entry)] = os.stat('/proc/' + entry).st_uid
        except FileNotFoundError:
            pass
seen
"""


async def test_proc_lists_only_the_family(local: LocalProvider) -> None:
    parent = await local.create("parent", LIMITS)
    assert value(await run(parent, "1")) == 1
    child = await local.fork(parent, "child")
    stranger = await local.create("stranger", LIMITS)
    assert parent.pid is not None
    assert child.pid is not None
    assert stranger.pid is not None
    for box in (parent, child, stranger):
        seen = {int(pid): uid for pid, uid in value(await run(box, LIST_PROC)).items()}
        assert set(seen.values()) == {box.uid}, seen  # the family's uid, no one else's
        assert 1 in seen  # the family's init
        # the namespace's own numbers, whatever the host's (which wrap past pid_max, so a
        # host pid can be small and coincide with one of them by chance)
        assert max(seen) < 1000, seen
    # the family (parent, its checkpoint, the child, init) in one namespace, the stranger alone
    family = value(await run(parent, LIST_PROC))
    assert len(family) >= 4
    assert "1" in value(await run(child, LIST_PROC))
    assert len(value(await run(stranger, LIST_PROC))) < len(family)
    for box in (child, parent, stranger):
        await box.destroy()


async def test_the_family_ends_with_its_last_member(local: LocalProvider) -> None:
    parent = await local.create("parent", LIMITS)
    assert value(await run(parent, "1")) == 1
    child = await local.fork(parent, "child")
    # a daemon the child leaves behind, out of its process group
    daemon = (
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    import time\n"
        "    while True: time.sleep(1)\n"
        "'ok'"
    )
    assert value(await run(child, daemon)) == "ok"
    await parent.destroy()
    assert value(await run(child, "2")) == 2  # outlived its parent
    await child.destroy()
    assert processes_of(child.uid) == []


def processes_of(uid: int) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(entry)
            except FileNotFoundError:
                continue
    return found
