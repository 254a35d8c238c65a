"""What ties an event to the subject it is stored on.

The hash chain covers bytes, not where they sit: an event copied to another tenant's, session's
or run's subject would still chain. So the envelope names its tenant (always) and its session
and run (where set), and the store refuses, and verification flags, an event whose names
disagree with its subject. The subject's tenant is also the only tenant a blob is read for.
"""

from typing import Protocol


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
    parts = subject.split(".")
    if len(parts) >= 4 and parts[0] == "fleet" and parts[1] in ("session", "sandbox"):
        return parts[2]
    return None


def binding_problem(subject: str, envelope: Named) -> str | None:
    """Why `envelope` cannot be stored on `subject`, or None when it belongs there."""
    parts = subject.split(".")
    tenant = subject_tenant(subject)
    if tenant is not None and envelope.tenant != tenant:
        return f"event {envelope.id} names tenant {envelope.tenant!r} but {subject} is {tenant!r}'s"
    if parts[:2] == ["fleet", "session"] and len(parts) >= 5:
        session = parts[3]
        if envelope.session is not None and envelope.session != session:
            return (
                f"event {envelope.id} names session {envelope.session!r} but {subject} belongs "
                f"to session {session!r}"
            )
        if parts[4] == "run" and len(parts) == 6 and envelope.run not in (None, parts[5]):
            return (
                f"event {envelope.id} names run {envelope.run!r} but {subject} is run "
                f"{parts[5]!r}'s"
            )
    return None
