"""The agent's decisions, pure: no I/O, no asyncio. Each bounded part has its module:

- `turns`: a session's turn lifecycle as a fold over its `.log` (admission, attempts, cancels,
  parks) and the dispatcher's and the worker's decisions on it (`dispatch`, `start`,
  `finish`), each saying what it stores (`events`) for the decider kernel (`turn_log`).
- `session_state`: the chat agent's session memory as a fold.
- here: the child-run worker's one decision of its own, and the facts the chat agent appends
  to a session's log, which commute with everyone else's (`facts`).
"""

from dataclasses import dataclass

from fleet_events import Event
from fleet_events.run import RunFailed

CHILD_ATTEMPTS = 3
"""Deliveries of a child run that may run it; the next records it lost."""

REPLICA_LOST = (
    f"the replicas running this child run stopped before it ended, {CHILD_ATTEMPTS} times: "
    "ask for the sub-task again"
)


def child_lost() -> RunFailed:
    """A child run whose every holder died: recorded by its last delivery, so its parent's
    `sub_rlm` returns an error it may retry, instead of waiting forever."""
    return RunFailed(error=REPLICA_LOST, reason="replica_lost", retryable=True)


@dataclass(frozen=True)
class Fact:
    """A fact the chat agent appends whatever the log holds (memory, documents, input
    requests): stored as it is, after whatever others stored meanwhile."""

    event: Event

    @property
    def events(self) -> tuple[Event, ...]:
        return (self.event,)


def facts(_: object, event: Event) -> Fact:
    return Fact(event)
