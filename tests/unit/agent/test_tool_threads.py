"""Tool-call threads: reused when idle, never capped (a tool may block on a nested one)."""

import threading
from functools import partial

from fleet_agent.sandbox_bus import ToolThreads
from fleet_harness.waits import eventually_sync


def test_calls_that_block_on_each_other_each_get_a_thread() -> None:
    threads = ToolThreads()
    together = threading.Barrier(4, timeout=10)
    done: list[int] = []
    for i in range(4):
        threads.run(partial(_meet_then_note, together, done, i))
    eventually_sync(lambda: len(done) == 4 or None, timeout=10, what="all four calls")
    assert sorted(done) == [0, 1, 2, 3]


def test_a_finished_thread_takes_the_next_call() -> None:
    threads = ToolThreads()
    seen: list[int] = []
    threads.run(lambda: seen.append(threading.get_ident()))
    eventually_sync(lambda: len(seen) == 1 or None, timeout=10, what="the first call")
    # the thread goes idle right after its call: wait for that, then hand it another
    eventually_sync(lambda: threads._idle == 1 or None, timeout=10, what="an idle thread")
    threads.run(lambda: seen.append(threading.get_ident()))
    eventually_sync(lambda: len(seen) == 2 or None, timeout=10, what="the second call")
    assert seen[0] == seen[1]


def test_idle_threads_exit_after_their_idle_time() -> None:
    threads = ToolThreads(idle_s=0.01)
    idents: list[int] = []
    threads.run(lambda: idents.append(threading.get_ident()))

    def exited() -> bool | None:
        alive = {thread.ident for thread in threading.enumerate()}
        return (bool(idents) and idents[0] not in alive) or None

    eventually_sync(exited, timeout=10, what="the idle thread to exit")
    assert threads._idle == 0
    again = threading.Event()
    threads.run(again.set)
    assert again.wait(10)


def _meet_then_note(together: threading.Barrier, done: list[int], i: int) -> None:
    together.wait()
    done.append(i)
