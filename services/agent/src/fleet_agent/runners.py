"""What runs a turn once a replica holds it: the `TurnRunner` seam, and one stand-in.

The chat agent (`fleet_agent.chat`, the default) and the recursive engine plug in here; beside
them `EchoRunner` answers with the message itself, a step per word (`FLEET_AGENT_RUNNER=echo`):
a turn going round the mesh with no model. The test fake that reaches a point in a turn by a
barrier (`FLEET_AGENT_RUNNER=scripted`) lives in `fleet_harness.agent_fakes`, which composes
the agent with it: the agent imports no test code.

A runner checks `token` between steps and, once it is set, returns `Stopped` with what it had
answered so far; the worker records `TurnCancelled` with that partial answer.
"""

import asyncio
from dataclasses import dataclass
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
    answered_by: str = ""
    fallback: str = ""
    """`TurnCompleted.fallback`: set when a lower module answered after the first failed."""


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
    `code`. A runner's exception is recorded by its type only, unless it states a failure
    (`fleet_agent.run.failures`)."""

    error: str
    code: str
    retryable: bool = False


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
