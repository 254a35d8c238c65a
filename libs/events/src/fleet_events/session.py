"""Session context: the conversation log (`fleet.session.<tenant>.<session>.log`)."""

from fleet_events.envelope import Event
from fleet_events.ids import check_id


def log_subject(tenant: str, session: str) -> str:
    return f"fleet.session.{check_id('tenant', tenant)}.{check_id('session', session)}.log"


def run_subject(tenant: str, session: str, run: str) -> str:
    return (
        f"fleet.session.{check_id('tenant', tenant)}.{check_id('session', session)}"
        f".run.{check_id('run', run)}"
    )


def session_filter(tenant: str, session: str) -> str:
    """Every subject of one session (its log and all its runs), replayed in stream order."""
    return f"fleet.session.{check_id('tenant', tenant)}.{check_id('session', session)}.>"


def tenant_filter(tenant: str) -> str:
    return f"fleet.session.{check_id('tenant', tenant)}.>"


class SessionCreated(Event, frozen=True, kw_only=True, tag="session.created"):
    """A conversation begins; the first event of its `.log` chain."""

    title: str = ""
    owner: str = ""


class SessionRenamed(Event, frozen=True, kw_only=True, tag="session.renamed"):
    """The session's title changed."""

    title: str


class SessionDeleted(Event, frozen=True, kw_only=True, tag="session.deleted"):
    """A tombstone: the log stays; purging data is a separate admin operation."""

    reason: str = ""


class TurnRequested(Event, frozen=True, kw_only=True, tag="turn.requested"):
    """A user message arrived; the dispatcher turns it into a work item keyed by the turn id."""

    message: str


class TurnStarted(Event, frozen=True, kw_only=True, tag="turn.started"):
    """An agent replica pulled the turn's work item (`attempt` > 1 after a redelivery)."""

    replica: str
    attempt: int = 1


class TurnCompleted(Event, frozen=True, kw_only=True, tag="turn.completed"):
    """The turn's answer; `root_head_hash` ties in the root run's chain."""

    answer: str
    root_head_hash: str = ""


class TurnFailed(Event, frozen=True, kw_only=True, tag="turn.failed"):
    """The turn ended in an error; `retryable` tells the client whether asking again may help."""

    error: str
    retryable: bool = False


class TurnCancelled(Event, frozen=True, kw_only=True, tag="turn.cancelled"):
    """The user cancelled the turn; the running replica stops at its next step."""

    reason: str = ""


class SnapshotTaken(Event, frozen=True, kw_only=True, tag="session.snapshot_taken"):
    """A fold of this session was snapshotted up to `upto_seq` (stored in the snapshot KV)."""

    fold: str
    fold_version: int
    upto_seq: int


EVENTS: tuple[type[Event], ...] = (
    SessionCreated,
    SessionRenamed,
    SessionDeleted,
    TurnRequested,
    TurnStarted,
    TurnCompleted,
    TurnFailed,
    TurnCancelled,
    SnapshotTaken,
)
