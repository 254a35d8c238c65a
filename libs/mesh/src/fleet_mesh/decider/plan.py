"""The decider kernel's pure part: what a subject's fold is, and how a group commit is planned.

No I/O, no asyncio, no clock: `plan` decides every queued request of one subject, in order,
against one state and returns the envelopes to append as one atomic batch and each request's
answer. The driver (`kernel.Decider`) only reads, appends and retries.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from fleet_events import Envelope, Event
from fleet_mesh.store.model import EMPTY, Head, StoredEvent

S = TypeVar("S")
D = TypeVar("D", bound="Decided")


class Decided(Protocol):
    """A decision: the events it stores (none: the answer is already on the log, or the
    command changes nothing). The kernel hands the decision itself back to the caller."""

    @property
    def events(self) -> Sequence[Event]: ...


@dataclass(frozen=True, slots=True)
class Decision(Generic[S]):
    """A ready-made `Decided` for callers whose answer is just the events (or a value)."""

    events: tuple[Event, ...] = ()
    answer: S | None = None


@dataclass(frozen=True)
class Ledger(Generic[S]):
    """How one kind of subject is folded.

    `evolve` may mutate the state it is given and must return the state to keep (a fold owns
    its state: copying a request index per event would make a replay quadratic). `clone` makes
    the scratch copy a group commit decides on, deep enough that evolving the copy leaves the
    original untouched (default: no group commit state is shared, so a full deep copy).
    `types`: the `Fleet-Type`s folded; other events are skipped undecoded (a type a newer
    writer added cannot stop this fold); None folds every event. `name`/`version`/`state_type`
    key and decode snapshots (bump `version` when `evolve` changes meaning).
    """

    name: str
    initial: Callable[[], S]
    evolve: Callable[[S, StoredEvent], S]
    clone: Callable[[S], S]
    version: int = 1
    state_type: type[S] | None = None
    types: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Request(Generic[S, D]):
    """One command waiting for its subject: `decide` answers it from the state, `wrap` makes
    the envelope of each event it stores (the id: the request id for an idempotent request)."""

    request_id: str | None
    decide: Callable[[S], D]
    wrap: Callable[[S, Event], Envelope[Any]]


@dataclass
class Plan(Generic[S, D]):
    """A planned group commit. `state`: the state after the batch's events (the input itself
    when one request was decided: nothing was evolved yet). `owners[i]`: the index of the
    request whose event `envelopes[i]` is. `stale`: the request whose decide raised a stale
    error before the state was known to be caught up; planning stopped there."""

    state: S
    envelopes: list[Envelope[Any]] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    answers: dict[int, D | Exception] = field(default_factory=dict)
    stale: int | None = None


def provisional(subject: str, envelope: Envelope[Any]) -> StoredEvent:
    """An event decided in a group commit, folded into the scratch state before it is stored:
    its position is not known yet (seq 0, no hash). A fold that records positions sees them
    only for events folded after they were stored."""
    return StoredEvent(subject=subject, seq=0, envelope=envelope, hash="", prev_hash="")


def plan(
    ledger: Ledger[S],
    subject: str,
    state: S,
    requests: Sequence[Request[S, D]],
    *,
    stale: tuple[type[Exception], ...] = (),
    caught_up: bool = False,
) -> Plan[S, D]:
    """Decide `requests` in order; each one sees the events of those before it.

    A decide that raises one of `stale` means "the state may be behind": unless `caught_up`,
    planning stops so the driver can read the tail first; once caught up, it is that request's
    answer. Any other exception answers its own request only (a malformed command).
    """
    scratch = ledger.clone(state) if len(requests) > 1 else state
    planned: Plan[S, D] = Plan(scratch)
    for index, request in enumerate(requests):
        try:
            decided = request.decide(scratch)
        except stale as exc:
            if not caught_up:
                planned.stale = index
                return planned
            planned.answers[index] = exc
            continue
        except Exception as exc:  # malformed: this request only
            planned.answers[index] = exc
            continue
        for event in decided.events:
            envelope = request.wrap(scratch, event)
            planned.envelopes.append(envelope)
            planned.owners.append(index)
            if len(requests) > 1:
                scratch = ledger.evolve(scratch, provisional(subject, envelope))
        planned.answers[index] = decided
    planned.state = scratch
    return planned


def chains_on(head: Head, prev_hash: str | None) -> bool:
    """Whether the first event of a tail read after `head` continues the fold's chain. It does
    not when the subject was purged (and perhaps begun again) since the fold was made: the fold
    is then thrown away and made again from the start. A fold from nothing accepts any start
    (the stream's limits may have removed a subject's first events)."""
    return head == EMPTY or prev_hash == head.hash
