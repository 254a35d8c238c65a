"""Fork: a child sandbox with the parent's REPL state as of its last completed cell."""

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_mesh.rpc import RemoteError


def test_child_gets_parent_state_and_files_and_changes_never_flow_back(bus: SandboxBus) -> None:
    parent = bus.create_sandbox()
    repl = RemoteInterpreter(bus, parent.sandbox)
    try:
        repl.execute("data = {'n': 1}\nimport json\nopen('notes.txt', 'w').write('from parent')")
        child = bus.fork_sandbox(parent.sandbox)
        assert child.parent == parent.sandbox
        assert repl.context in child.contexts
        assert child.workspace != parent.workspace
        # the child continues the parent's context (same name) in its own process
        child_repl = RemoteInterpreter(bus, child.sandbox, context=repl.context)
        try:
            got = child_repl.execute("data['n'], open('notes.txt').read(), json.dumps([1])")
            assert got == [1, "from parent", "[1]"]
            child_repl.execute("data['n'] = 99\nopen('notes.txt', 'w').write('from child')")
            child_repl.execute("open('child_only.txt', 'w').write('x')")
            assert child_repl.execute("data['n']") == 99
        finally:
            child_repl.shutdown()
        assert repl.execute("data['n'], open('notes.txt').read()") == [1, "from parent"]
        assert repl.execute("import os\nos.path.exists('child_only.txt')") is False
        bus.delete_sandbox(child.sandbox)
    finally:
        repl.shutdown()
        bus.delete_sandbox(parent.sandbox)


def test_a_fork_taken_mid_cell_sees_the_last_completed_cell(bus: SandboxBus) -> None:
    parent = bus.create_sandbox()
    repl = RemoteInterpreter(bus, parent.sandbox)
    seen: dict[str, Any] = {}

    def fork_me() -> str:
        child = bus.fork_sandbox(parent.sandbox)
        child_repl = RemoteInterpreter(bus, child.sandbox, context=repl.context)
        try:
            seen["x"] = child_repl.execute("x")
            seen["threads"] = child_repl.execute("import threading\nthreading.active_count()")
        finally:
            child_repl.shutdown()
            bus.delete_sandbox(child.sandbox)
        return child.sandbox

    repl.tools["fork_me"] = fork_me
    try:
        repl.execute("x = 'completed'")
        # this cell changes x, then forks while it is still running
        repl.execute("x = 'in flight'\nchild = fork_me()")
        assert seen["x"] == "completed"
        assert seen["threads"] >= 1
        assert repl.execute("x") == "in flight"
    finally:
        repl.shutdown()
        bus.delete_sandbox(parent.sandbox)


def test_concurrent_forks_of_one_parent(bus: SandboxBus) -> None:
    parent = bus.create_sandbox()
    repl = RemoteInterpreter(bus, parent.sandbox)
    repl.execute("base = 10")
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def fork_and_read(i: int) -> None:
        try:
            child = bus.fork_sandbox(parent.sandbox)
            child_repl = RemoteInterpreter(bus, child.sandbox, context=repl.context)
            results[i] = child_repl.execute(f"base + {i}")
            child_repl.shutdown()
            bus.delete_sandbox(child.sandbox)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=fork_and_read, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert errors == []
        assert results == {0: 10, 1: 11, 2: 12, 3: 13}
    finally:
        repl.shutdown()
        bus.delete_sandbox(parent.sandbox)


def _child_reads(bus: SandboxBus, sandbox: str, context: str, code: str) -> Any:
    child = bus.fork_sandbox(sandbox)
    child_repl = RemoteInterpreter(bus, child.sandbox, context=context)
    try:
        return child_repl.execute(code)
    finally:
        child_repl.shutdown()
        bus.delete_sandbox(child.sandbox)


def test_a_fork_requested_the_moment_a_cell_answers_sees_that_cell(bus: SandboxBus) -> None:
    # The runner answers first and takes its checkpoint after: a fork that overtakes the
    # checkpoint must take it itself, never fork from the one before.
    parent = bus.create_sandbox()
    repl = RemoteInterpreter(bus, parent.sandbox)
    try:
        for i in range(6):
            repl.execute(f"n = {i}\nbox = [n] * 3")
            assert _child_reads(bus, parent.sandbox, repl.context, "n, box") == [i, [i, i, i]]
    finally:
        repl.shutdown()
        bus.delete_sandbox(parent.sandbox)


def test_without_checkpoints_a_fork_mid_cell_is_refused_never_stale(bus: SandboxBus) -> None:
    # fork_ready=False keeps no checkpoint per cell: a fork between cells takes one then,
    # but once the next cell has started that copy is stale and must not be used.
    parent = bus.create_sandbox(fork_ready=False)
    repl = RemoteInterpreter(bus, parent.sandbox)
    refused: list[str] = []

    def fork_me() -> str:
        try:
            return str(_child_reads(bus, parent.sandbox, repl.context, "x"))
        except Exception as exc:
            refused.append(str(exc))
            return "refused"

    repl.tools["fork_me"] = fork_me
    try:
        repl.execute("x = 1")
        assert _child_reads(bus, parent.sandbox, repl.context, "x") == 1
        repl.execute("x = 2")
        assert repl.execute("x = 3\nfork_me()") == "refused"
        assert "fork_ready=False" in refused[0]
        # between cells it works again, with the latest state
        assert _child_reads(bus, parent.sandbox, repl.context, "x") == 3
    finally:
        repl.shutdown()
        bus.delete_sandbox(parent.sandbox)


def _root_only_file(directory: Path, text: str) -> Path:
    """A root-owned 0600 file in a 0700 root-owned directory: no sandbox uid can reach it."""
    os.chmod(directory, 0o700)
    target = directory / "target.txt"
    target.write_text(text)
    os.chmod(target, 0o600)
    return target


PLANT = """
import os, sys
Runner = sys.modules["__main__"].Runner
_fork = Runner.fork
def fork(self, msg):
    os.symlink({target!r}, os.path.join(msg["cwd"], "evil.txt"))
    return _fork(self, msg)
Runner.fork = fork
open("evil.txt", "w").write("written by the sandbox")
"""


def test_a_link_planted_in_the_childs_workspace_cannot_reach_a_host_file(
    bus: SandboxBus, tmp_path: Path
) -> None:
    """The parent's runner is the sandbox's: it plants a link where the fork's copy will
    write. The copy runs as the sandbox's uid, so the host file stays as it was."""
    target = _root_only_file(tmp_path, "host data")
    parent = bus.create_sandbox()
    repl = RemoteInterpreter(bus, parent.sandbox)
    try:
        repl.execute(PLANT.format(target=str(target)))
        # the copy, as the uid, cannot open the link's target: the fork fails, nothing written
        with pytest.raises(RemoteError, match="copying the workspace failed"):
            bus.fork_sandbox(parent.sandbox)
        info = target.stat()
        assert target.read_text() == "host data"
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o600)
    finally:
        repl.shutdown()
        bus.delete_sandbox(parent.sandbox)


def test_a_fork_keeps_modes_links_and_times_of_the_workspace(bus: SandboxBus) -> None:
    parent = bus.create_sandbox()
    repl = RemoteInterpreter(bus, parent.sandbox)
    code = (
        "import os\nos.makedirs('d/e')\nopen('d/e/run.sh', 'w').write('x')\n"
        "os.chmod('d/e/run.sh', 0o750)\nos.utime('d/e/run.sh', (1000000, 1000000))\n"
        "os.symlink('e/run.sh', 'd/link')\nos.chmod('d', 0o701)"
    )
    probe = (
        "import os\ns = os.stat('d/e/run.sh')\n"
        "(oct(s.st_mode & 0o7777), int(s.st_mtime), os.readlink('d/link'),"
        " oct(os.stat('d').st_mode & 0o7777), os.getuid() == s.st_uid)"
    )
    try:
        repl.execute(code)
        child = bus.fork_sandbox(parent.sandbox)
        child_repl = RemoteInterpreter(bus, child.sandbox, context=repl.context)
        try:
            assert child_repl.execute(probe) == ["0o750", 1000000, "e/run.sh", "0o701", True]
        finally:
            child_repl.shutdown()
            bus.delete_sandbox(child.sandbox)
    finally:
        repl.shutdown()
        bus.delete_sandbox(parent.sandbox)
