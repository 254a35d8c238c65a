"""Fork: a child sandbox with the parent's REPL state as of its last completed cell."""

import threading
from typing import Any

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus


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
