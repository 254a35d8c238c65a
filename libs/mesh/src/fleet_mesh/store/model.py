"""What the store hands out: heads, append results, stored events, folds and their loads."""

from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from fleet_events import Envelope
from fleet_events.chain import GENESIS, ChainFault

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Head:
    """The last event of one subject: its stream sequence (0 = none yet) and chain hash."""

    seq: int
    hash: str


EMPTY = Head(0, GENESIS)


@dataclass(frozen=True, slots=True)
class Appended:
    seq: int
    hash: str
    duplicate: bool = False

    @property
    def head(self) -> Head:
        return Head(self.seq, self.hash)


@dataclass(frozen=True, slots=True)
class RawEvent:
    """A stored message as the server holds it: the bytes the chain covers, undecoded."""

    subject: str
    seq: int
    headers: dict[str, str]
    data: bytes


@dataclass(frozen=True, slots=True)
class StoredEvent:
    subject: str
    seq: int
    envelope: Envelope[Any]
    hash: str
    prev_hash: str


class Fold(Protocol[S]):
    """A left fold over stored events. Bump `version` whenever `evolve` changes meaning."""

    name: str
    version: int
    state_type: type[S]

    def initial(self) -> S: ...

    def evolve(self, state: S, event: StoredEvent) -> S: ...


@dataclass(slots=True)
class Loaded(Generic[S]):
    state: S
    seq: int = 0  # stream sequence of the last event folded in
    heads: dict[str, Head] = field(default_factory=dict)
    replayed: int = 0  # events folded by this load (tail only, after a snapshot)
    from_snapshot: bool = False

    def head(self, subject: str) -> Head:
        return self.heads.get(subject, EMPTY)


@dataclass(frozen=True, slots=True)
class Verification:
    checked: int
    fault: ChainFault | None

    @property
    def ok(self) -> bool:
        return self.fault is None
