"""Bounded waits on a condition: the only way a test waits for something to happen."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


@overload
async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T | None],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...


async def eventually(
    probe: Callable[[], Awaitable[T | None]] | Callable[[], T | None],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
            if asyncio.iscoroutine(value):
                # a probe that hangs must not outlive the wait's own bound
                value = await asyncio.wait_for(value, max(0.01, deadline - time.monotonic()))
            if value:
                return value  # type: ignore[return-value]
        except Exception as exc:  # a probe may fail while the thing comes up
            last_error = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout}s waiting for {what}") from last_error
        await asyncio.sleep(interval)


def eventually_sync(
    probe: Callable[[], T | None],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout}s waiting for {what}") from last_error
        time.sleep(interval)
