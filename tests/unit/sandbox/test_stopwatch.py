"""A cell's wall-time budget excludes time spent waiting on host tools."""

from fleet_sandbox_broker.domain import Stopwatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_running_time_counts() -> None:
    clock = Clock()
    watch = Stopwatch(2.0, clock)
    clock.now += 1.5
    assert watch.remaining() == 0.5
    assert not watch.paused


def test_time_waiting_on_callbacks_does_not_count_even_when_they_overlap() -> None:
    clock = Clock()
    watch = Stopwatch(2.0, clock)
    clock.now += 0.5
    watch.pause()  # first tool call
    clock.now += 10
    watch.pause()  # a second, concurrent one
    clock.now += 10
    watch.resume()
    assert watch.paused
    clock.now += 10
    watch.resume()
    assert (watch.paused, watch.spent()) == (False, 0.5)  # one tuple: mypy keeps the narrowing
    clock.now += 1.0
    assert watch.remaining() == 0.5
