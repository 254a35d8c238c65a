"""What runs a turn once a replica holds it: the `TurnRunner` seam, and two stand-ins.

The chat agent (`fleet_agent.chat`, the default) and the recursive engine plug in here; beside
them:

- `EchoRunner` answers with the message itself, a step per word (`FLEET_AGENT_RUNNER=echo`): a
  turn going round the mesh with no model.
- `ScriptedRunner` is a **test fake** (named so on purpose): the echo plus directives a test
  writes into the message, to reach a point in a turn by a barrier rather than by timing:
  `[hold:NAME]` writes `NAME.reached.<attempt>` (holding the replica's name) into the barrier
  directory and waits until a file `NAME` appears there or the turn is cancelled; `[die]`
  SIGKILLs its own process (a poison turn); `[fail]` raises. It runs only when
  `FLEET_AGENT_RUNNER=scripted` and a barrier directory are set: user text never drives it.

A runner checks `token` between steps and, once it is set, returns `Stopped` with what it had
answered so far; the worker records `TurnCancelled` with that partial answer.
"""

import asyncio
import contextlib
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class TurnInput:
    tenant: str
    session: str
    turn: str
    message: str
    attempt: int
    replica: str


class CancelToken:
    """Set when a `CancelRequested` for the running turn lands on the session's log."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason = ""

    def cancel(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


@dataclass(frozen=True)
class Answered:
    answer: str
    root_head_hash: str = ""
    """The root run's chain head, when the runner keeps a run record (`TurnCompleted` ties
    it in)."""


@dataclass(frozen=True)
class Stopped:
    partial: str


@dataclass(frozen=True)
class Parked:
    """The turn asked the user (`input.requested` with `request_id` is stored) and gives its
    worker back: the worker records `TurnParked` and acks; the answer resumes it."""

    request_id: str


@dataclass(frozen=True)
class Failed:
    """The runner could not run the turn, for a reason it can state safely and the user can
    act on (no model is configured): the worker records `TurnFailed` with this `error` and
    `code`. A runner's exception, by contrast, is recorded by its type only."""

    error: str
    code: str
    retryable: bool = False


class StatedFailure(RuntimeError):
    """Raised from deep inside a run (a seam that cannot return `Failed`) for a reason that is
    safe to state and that the user can act on: the worker records it as `TurnFailed` with this
    message and code, found anywhere in the exception's cause chain (a runner may wrap it)."""

    def __init__(self, message: str, *, code: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.failure = Failed(message, code=code, retryable=retryable)


def stated_failure(exc: BaseException) -> Failed | None:
    """The failure `exc` states, if it or one of its causes states one: a `StatedFailure`, or
    the budget's refusal of a model call the run could not do without (its message is the
    budget service's own, which names the cap and never a secret)."""
    from fleet_agent.lm import BudgetSpent  # lazily: the echo runner never loads dspy

    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, StatedFailure):
            return seen.failure
        if isinstance(seen, BudgetSpent):
            return Failed(
                f"the budget refused this turn's model call: {str(seen)[:500]}. A tenant's "
                "daily cap starts again at 00:00 UTC; a turn's own limits are the "
                "rlm_max_llm_calls and rlm_max_depth settings",
                code="budget_spent",
            )
        seen = seen.__cause__ or seen.__context__
    return None


class TurnRunner(Protocol):
    restartable: bool
    """May a turn whose replica died be run again from its start on another replica? True
    only where running it again repays nothing (no model calls); resuming from the log is
    the crash-safe-turns issue."""

    async def run(
        self, turn: TurnInput, token: CancelToken
    ) -> Answered | Stopped | Parked | Failed: ...


class EchoRunner:
    restartable = True

    async def run(self, turn: TurnInput, token: CancelToken) -> Answered | Stopped:
        said: list[str] = []
        for word in turn.message.split():
            if token.cancelled:
                return Stopped(" ".join(said))
            said.append(word)
            await asyncio.sleep(0)  # a step boundary: let a cancel land
        return Answered(" ".join(said))


DIRECTIVE = re.compile(r"\[(hold|die|fail)(?::([A-Za-z0-9_-]{1,64}))?\]")


class ScriptedFailure(RuntimeError):
    """`[fail]`: the fake agent raising, as a real one might."""


class ScriptedRunner:
    """A test fake: see the module docstring."""

    restartable = True

    def __init__(self, barriers: Path, *, poll_s: float = 0.01) -> None:
        self._barriers = barriers
        self._poll = poll_s

    async def run(self, turn: TurnInput, token: CancelToken) -> Answered | Stopped:
        said: list[str] = []
        for word in turn.message.split():
            if token.cancelled:
                return Stopped(" ".join(said))
            directive = DIRECTIVE.fullmatch(word)
            if directive is None:
                said.append(word)
                await asyncio.sleep(0)
                continue
            kind, name = directive.groups()
            if kind == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "fail":
                raise ScriptedFailure("scripted failure (the [fail] directive)")
            if kind == "hold" and name:
                await self._hold(name, turn, token)
        if token.cancelled:
            return Stopped(" ".join(said))
        return Answered(" ".join(said))

    async def _hold(self, name: str, turn: TurnInput, token: CancelToken) -> None:
        (self._barriers / f"{name}.reached.{turn.attempt}").write_text(turn.replica)
        release = self._barriers / name
        while not release.exists() and not token.cancelled:
            # A fake's barrier: a bounded poll of a file the test creates, or the cancel.
            waiter = asyncio.ensure_future(token.wait())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, self._poll)
