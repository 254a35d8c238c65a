"""What ties an event to the subject it is stored on.

The hash chain covers bytes, not where they sit: an event copied to another tenant's, session's
or run's subject would still chain. So the envelope names its tenant (always), a session event
names its session, a run's event its run, and the store refuses, and verification flags, an
event whose names disagree with its subject. An event that names no session would fit every
session's log, so on a session subject a missing name is a disagreement too. Subjects have
exactly the shapes the builders make: a longer one (`….run.<run>.extra`) would sit outside
every check that reads tokens by position.

The subject's tenant is also the only tenant a blob is read for.
"""

from typing import Protocol

from fleet_events import subjects

SESSION_SHAPES = (
    "a session subject is fleet.session.<tenant>.<session>.log or "
    "fleet.session.<tenant>.<session>.run.<run>"
)
SANDBOX_SHAPE = "a sandbox subject is fleet.sandbox.<tenant>.<sandbox>"


class Named(Protocol):
    """What binding looks at: an `Envelope`, or just its names decoded from stored bytes."""

    @property
    def id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def session(self) -> str | None: ...
    @property
    def run(self) -> str | None: ...


def subject_tenant(subject: str) -> str | None:
    """The tenant token of a tenant-scoped subject (sessions, sandboxes), else None."""
    return subjects.tenant_token(subject)


def session_tokens(subject: str) -> tuple[str, str | None] | None:
    """(session, run) of a session subject of either shape (run None on a `.log`), else None."""
    where = subjects.parse_session(subject)
    return None if where is None else (where.session, where.run)


def _shape_problem(subject: str) -> str | None:
    space = subjects.space_of(subject)
    if space == "session" and subjects.parse_session(subject) is None:
        return SESSION_SHAPES
    if space == "sandbox" and subjects.SANDBOX.parse(subject) is None:
        return SANDBOX_SHAPE
    return None


def binding_problem(subject: str, envelope: Named) -> str | None:
    """Why `envelope` cannot be stored on `subject`, or None when it belongs there."""
    shape = _shape_problem(subject)
    if shape is not None:
        return f"event {envelope.id} cannot be stored on {subject}: {shape}"
    tenant = subject_tenant(subject)
    if tenant is not None and envelope.tenant != tenant:
        return f"event {envelope.id} names tenant {envelope.tenant!r} but {subject} is {tenant!r}'s"
    tokens = session_tokens(subject)
    if tokens is None:
        return None
    session, run = tokens
    if envelope.session is None:
        return (
            f"event {envelope.id} names no session but {subject} belongs to session "
            f"{session!r}: set the envelope's session to {session!r}"
        )
    if envelope.session != session:
        return (
            f"event {envelope.id} names session {envelope.session!r} but {subject} belongs "
            f"to session {session!r}"
        )
    if run is not None and envelope.run is None:
        return (
            f"event {envelope.id} names no run but {subject} is run {run!r}'s: "
            f"set the envelope's run to {run!r}"
        )
    if run is not None and envelope.run != run:
        return f"event {envelope.id} names run {envelope.run!r} but {subject} is run {run!r}'s"
    return None
