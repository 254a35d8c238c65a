"""The agent's seams into dspy: one predictor wrapper, one bridge each way between dspy's
synchronous loop and the agent's event loops.

dspy 3.4.1 gives its loops (ReAct, RLM) no hooks; what the agent records is taken where a
module calls one of its predictors (`Predictor`: a step boundary before the call, the plan
recorded after it) and where the loop blocks on the mesh. dspy's loop is synchronous and runs
in a thread of its own (`in_own_thread`); from there it reaches the agent's loops with
`blocking` (a coroutine run on a loop, waited for from the thread).
"""

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Predictor:
    """Stands in for one of a dspy module's predictors: `before` with the call's inputs (a
    step boundary: it may raise to stop the loop), the same call, then `after` with what it
    predicted (the plan recorded). dspy reads the predictor's `signature`: it is the wrapped
    one's."""

    def __init__(
        self,
        predict: Any,
        *,
        before: Callable[[dict[str, Any]], object] | None = None,
        after: Callable[[Any], object] | None = None,
    ) -> None:
        self.predict = predict
        self.before = before
        self.after = after

    @property
    def signature(self) -> Any:
        return self.predict.signature

    def __call__(self, **kwargs: Any) -> Any:
        if self.before is not None:
            self.before(kwargs)
        prediction = self.predict(**kwargs)
        if self.after is not None:
            self.after(prediction)
        return prediction


async def in_own_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run `fn` (dspy's synchronous loop, or a call that blocks like it) in a thread of its
    own and await it. Not `asyncio.to_thread`: its executor has min(32, cores + 4) threads,
    and a run holds its thread while it waits on children, so a tree wider than that (84 runs
    at depth 3, fan-out 4) would wait on itself forever."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(outcome: tuple[bool, Any]) -> None:
        if future.done():
            return
        ok, value = outcome
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def body() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(deliver, outcome)

    threading.Thread(target=body, daemon=True, name=getattr(fn, "__name__", "engine")).start()
    return await future


def blocking(
    loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, T], timeout: float | None = None
) -> T:
    """Run `work` on `loop` and wait for it from dspy's thread (never from `loop` itself)."""
    return asyncio.run_coroutine_threadsafe(work, loop).result(timeout)


__all__ = ["Predictor", "blocking", "in_own_thread"]
