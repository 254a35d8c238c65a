"""A run's life over its journal, pure: given the record and an outcome, the run's events.

One attempt of a run begins in one of three ways, read from the record its subject holds
(`begin`): nothing recorded (`Fresh`: the run appends `run.started`), a record left by a holder
that died (`TakeOver`: `run.resumed`, then the run goes on from the record), or a record that
already ends (`FromRecord`: the recorded end stands and nothing runs again). A chat turn parked
on a question is a fourth, the chat runner's own: its record shows the parked call.

However the attempt ran, it comes to one `Outcome`: `Completed`, `Cancelled` or `Failure`, and
`ended` gives the one terminal event it appends (`run.completed`, `run.cancelled`,
`run.failed`). `recorded` reads a terminal event back into the outcome it recorded, and
`turn_end` turns an outcome into how the turn ends (`Answered`, `Stopped`, `Failed`, or the
`RunBroke` the worker records by its type only). The chat runner and the RLM engine both use
these, so a fresh run, a resumed one and one read from its record end the same way.

No I/O, no clock, no randomness: the tests are tables (tests/unit/agent/test_run_lifecycle.py),
and mutation testing covers this module.
"""

from dataclasses import dataclass, field
from typing import Any

from fleet_agent.run.failures import CODES, RUNNER_ERROR, SANDBOX_LOST, RunBroke, broken_code
from fleet_agent.run.failures import stated as stated_failure
from fleet_agent.run.failures import why as why_of
from fleet_agent.runners import Answered, Failed, Stopped
from fleet_events import Event
from fleet_events.journal import Journal
from fleet_events.run import RunCancelled, RunCompleted, RunFailed, RunResumed


@dataclass(frozen=True)
class Completed:
    answer: str
    outputs: dict[str, Any] = field(default_factory=dict)
    iterations: int = 0
    llm_calls: int = 0
    answered_by: str = ""
    fallback: str = ""


@dataclass(frozen=True)
class Cancelled:
    reason: str
    partial: str = ""


@dataclass(frozen=True)
class Failure:
    """How a run failed. `error` is what `run.failed` records (for a stated failure, the
    user's message), `reason` its `reason` (the code, or the type that broke), `code` the
    turn's code, `retryable` the record's flag, `stated` whether `error` is the user's."""

    error: str
    reason: str
    code: str = RUNNER_ERROR
    retryable: bool = False
    stated: bool = False


Outcome = Completed | Cancelled | Failure


@dataclass(frozen=True)
class Fresh:
    """Nothing recorded: `run.started` first."""


@dataclass(frozen=True)
class TakeOver:
    """A record whose holder died before its end: `run.resumed`, then on from the record."""


@dataclass(frozen=True)
class FromRecord:
    """A record that ends: its end stands (the holder died before the turn recorded it)."""

    outcome: Outcome


Begin = Fresh | TakeOver | FromRecord


def begin(journal: Journal) -> Begin:
    """How an attempt of the run begins, given the record its subject holds."""
    if journal.ended is not None:
        return FromRecord(recorded(journal.ended))
    if journal.started is not None:
        return TakeOver()
    return Fresh()


def taken_over(
    journal: Journal,
    *,
    attempt: int,
    replica: str,
    in_flight: str | None = None,
    reused_calls: int | None = None,
    sandbox: str = "",
) -> RunResumed:
    """`run.resumed` for an attempt that takes the run over from its record: what it reuses,
    and the one step that repeats (the journal's own reading unless the runner knows better)."""
    return RunResumed(
        attempt=attempt,
        replica=replica,
        reused_calls=len(journal.calls) if reused_calls is None else reused_calls,
        reused_cells=len(journal.cells),
        in_flight=journal.in_flight if in_flight is None else in_flight,
        sandbox=sandbox,
    )


def failure(exc: BaseException, *, detailed: bool = False) -> Failure:
    """The outcome of a run that `exc` ended: the failure it states (its code and message), or
    a broken run named by its type (`detailed`: with its message, as the engine records)."""
    said = stated_failure(exc)
    if said is not None:
        return Failure(
            error=said.error, reason=said.code, code=said.code, retryable=said.retryable,
            stated=True,
        )  # fmt: skip
    code = broken_code(exc)
    return Failure(
        error=why_of(exc, detailed=detailed), reason=type(exc).__name__, code=code,
        retryable=code != RUNNER_ERROR and CODES[code].retryable,
    )  # fmt: skip


def lost(error: str) -> Failure:
    """A record that cannot be continued here: the sandbox its REPL state lived in is gone."""
    return Failure(error=error, reason=SANDBOX_LOST, code=SANDBOX_LOST, retryable=True)


def ended(outcome: Outcome) -> Event:
    """The one terminal event the run appends for `outcome`."""
    if isinstance(outcome, Completed):
        return RunCompleted(
            answer=outcome.answer, outputs=outcome.outputs, iterations=outcome.iterations,
            llm_calls=outcome.llm_calls, answered_by=outcome.answered_by,
            fallback=outcome.fallback,
        )  # fmt: skip
    if isinstance(outcome, Cancelled):
        return RunCancelled(reason=outcome.reason, partial_answer=outcome.partial)
    return RunFailed(error=outcome.error, reason=outcome.reason, retryable=outcome.retryable)


def recorded(end: Event) -> Outcome:
    """The outcome a terminal event recorded, read back as `ended` wrote it."""
    if isinstance(end, RunCompleted):
        return Completed(
            answer=end.answer, outputs=dict(end.outputs), iterations=end.iterations,
            llm_calls=end.llm_calls, answered_by=end.answered_by, fallback=end.fallback,
        )  # fmt: skip
    if isinstance(end, RunCancelled):
        return Cancelled(reason=end.reason, partial=end.partial_answer)
    if isinstance(end, RunFailed):
        known = end.reason in CODES
        return Failure(
            error=end.error, reason=end.reason, code=end.reason if known else RUNNER_ERROR,
            retryable=end.retryable, stated=known and CODES[end.reason].stated,
        )  # fmt: skip
    return Failure(error="the run ended", reason="")


def turn_end(outcome: Outcome, head_hash: str = "") -> Answered | Stopped | Failed:
    """How the turn ends for its root run's `outcome`; `head_hash` is the run chain's head
    after its end (`TurnCompleted` ties it in). A failure the run cannot state raises
    `RunBroke`: the worker records it by its type and code only."""
    if isinstance(outcome, Completed):
        return Answered(
            outcome.answer, root_head_hash=head_hash, answered_by=outcome.answered_by,
            fallback=outcome.fallback,
        )  # fmt: skip
    if isinstance(outcome, Cancelled):
        return Stopped(outcome.partial)
    if outcome.stated:
        return Failed(outcome.error, code=outcome.code, retryable=outcome.retryable)
    raise RunBroke(outcome.error, code=outcome.code)


def result_code(outcome: Failure) -> str:
    """The code a failed run's result carries to its caller (a parent run, the chat route):
    a stated failure's or a known broken one's (`sandbox_lost`); "" for a run that broke."""
    return outcome.code if outcome.stated or outcome.code != RUNNER_ERROR else ""


__all__ = [
    "Begin",
    "Cancelled",
    "Completed",
    "Failure",
    "Fresh",
    "FromRecord",
    "Outcome",
    "TakeOver",
    "begin",
    "ended",
    "failure",
    "lost",
    "recorded",
    "result_code",
    "taken_over",
    "turn_end",
]
