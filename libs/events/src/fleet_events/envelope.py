"""The envelope every persisted event travels in (docs/architecture.md, "Envelope").

`data` is a tagged union of frozen, keyword-only Structs. The tag (`type`) is a stable wire
name chosen by hand, never derived from a class name, so classes can be renamed freely.
"""

import uuid
from datetime import UTC, datetime
from typing import Generic, TypeVar

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every event payload. Subclasses set `tag="context.fact"` explicitly."""


class Actor(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    replica: str


class BlobRef(msgspec.Struct, frozen=True, kw_only=True):
    """A payload moved to the object store under `<tenant>/<sha256>`."""

    object: str
    sha256: str
    size: int


E = TypeVar("E")


class Envelope(msgspec.Struct, Generic[E], frozen=True, kw_only=True, omit_defaults=True):
    id: str
    tenant: str
    actor: Actor
    ts: datetime
    data: E
    session: str | None = None
    turn: str | None = None
    run: str | None = None
    parent_run: str | None = None
    causation: str | None = None
    correlation: str | None = None


def new_id() -> str:
    """A fresh event / request id: a subject-safe token (hex uuid4)."""
    return uuid.uuid4().hex


def utc_now() -> datetime:
    return datetime.now(UTC)


class Offloaded(Event, frozen=True, kw_only=True, tag="blob.offloaded"):
    """Stands in the log for an envelope too large to store inline.

    The stored bytes (and so the hash chain) cover this stub, whose `blob.sha256` pins the
    offloaded envelope's exact bytes: the chain still vouches for the full event.
    """

    blob: BlobRef
    of_type: str
