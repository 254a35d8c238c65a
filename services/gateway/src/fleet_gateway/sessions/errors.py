"""What a session command refuses, as domain errors with one root: a stable `code`, a message
saying what was wrong with which value and what to do, and the details a client branches on.
No HTTP here: `routes.session_errors` gives each its status, `routes.ws` its error frame."""

from typing import Any, ClassVar


class SessionError(Exception):
    """The root: every refusal of a session command."""

    code: ClassVar[str] = "session_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class SessionNotFound(SessionError):
    """No such session in the caller's tenant (another tenant's answers the same)."""

    code = "session_not_found"

    def __init__(self, session: str) -> None:
        super().__init__(
            f"no session {session!r} in your tenant: check the id (list them with GET "
            "/api/v1/sessions)",
            session=session,
        )


class SessionPurged(SessionError):
    """The id was purged: it is never opened again, and reads as not found."""

    code = "session_not_found"

    def __init__(self, session: str) -> None:
        super().__init__(
            f"session {session!r} was purged and its id cannot be reused: start a new session "
            "(another session_id, or POST /api/v1/sessions)",
            session=session,
        )


class SessionExists(SessionError):
    code = "session_exists"

    def __init__(self, session: str) -> None:
        super().__init__(
            f"session {session!r} exists already: pick another id, or write to it",
            session=session,
        )


class SessionIsDeleted(SessionError):
    code = "session_deleted"

    def __init__(self, session: str) -> None:
        super().__init__(
            f"session {session!r} is deleted (a tombstone); create a new session",
            session=session,
        )


class LogBusy(SessionError):
    """Other writers kept moving the log under this one: retrying soon will do."""

    code = "log_busy"

    def __init__(self, session: str, tries: int) -> None:
        super().__init__(
            f"session {session!r} kept changing under this write ({tries} tries); retry",
            session=session,
        )


class TurnNotFound(SessionError):
    code = "turn_not_found"

    def __init__(self, turn: str) -> None:
        super().__init__(
            f"no turn {turn!r} in this session: check the id (list them with GET "
            "/api/v1/sessions/{id}/turns)",
            turn=turn,
        )


class NoActiveTurn(SessionError):
    code = "no_active_turn"

    def __init__(self, session: str) -> None:
        super().__init__(
            f"session {session!r} has no queued or running turn to cancel; pass the turn's id",
            session=session,
        )


class DocumentsMissing(SessionError):
    code = "document_not_found"

    def __init__(self, session: str, missing: list[str], loaded: list[str]) -> None:
        super().__init__(
            f"document(s) {', '.join(repr(d) for d in missing)} are not loaded in session "
            f"{session!r}: upload them first (POST /api/v1/sessions/{session}/documents, "
            f"alias=<id>); loaded: {', '.join(sorted(loaded)) or 'none'}"
        )


class TurnsOverQuota(SessionError):
    code = "too_many_turns"

    def __init__(self, tenant: str, active: int, limit: int) -> None:
        super().__init__(
            f"tenant {tenant!r} has {active} turns queued or running, its limit is {limit}: "
            "wait for one to end (or cancel one) and ask again",
            active_turns=active,
            limit=limit,
        )


class RepositoryNotPublic(SessionError):
    """A turn's `repo_url` whose host resolves to an internal address (or to nothing): the
    broker would refuse the checkout, so the turn is refused before it is stored."""

    code = "address_not_public"

    def __init__(self, why: str) -> None:
        super().__init__(why, field="repo_url")


class InvalidKey(SessionError):
    """An idempotency key that is empty, too long or not printable; `where` names the field
    it came in (the `Idempotency-Key` header, the frame's `id`)."""

    code = "invalid_idempotency_key"

    def __init__(self, where: str, why: str) -> None:
        super().__init__(
            f"the {where} {why}: send 1 to 255 printable ASCII characters (a UUID is usual), "
            "the same value on every retry of one request",
            field=where,
        )


class KeyInFlight(SessionError):
    """A retry arrived while the first request under its key is still being written."""

    code = "idempotency_key_in_flight"

    def __init__(self, key: str) -> None:
        super().__init__(
            f"a request with idempotency key {key!r} is still in progress: retry it once that "
            "one has answered",
            idempotency_key=key,
        )


class KeyReused(SessionError):
    """The key was used for a different request: a retry must send the same body."""

    code = "idempotency_key_reused"

    def __init__(self, key: str, turn: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was used for a different turn request (turn {turn!r}) in "
            "this session: a retry must send the same body; use a new key for a new request",
            idempotency_key=key,
            turn=turn,
        )


class AdminRequired(SessionError):
    code = "admin_required"

    def __init__(self) -> None:
        super().__init__(
            "purging a session is an admin operation: ask an admin of your tenant (a token "
            "with the admin claim)"
        )


class SessionNotDeleted(SessionError):
    code = "session_not_deleted"

    def __init__(self, session: str) -> None:
        super().__init__(
            f"session {session!r} is active: delete it first (DELETE "
            f"/api/v1/sessions/{session}), then purge",
            session=session,
            status="active",
        )


class PurgeUnavailable(SessionError):
    code = "audit_unavailable"

    def __init__(self) -> None:
        super().__init__(
            "no checkpointer answers on the bus: a purge needs the process holding the "
            "checkpoint key (fleet up runs one; in a cluster `python -m fleet_mesh."
            "checkpoints`); nothing was purged"
        )


class PurgeTimeout(SessionError):
    code = "audit_timeout"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            f"the checkpointer did not answer within {timeout_s:g} s; it may still purge: "
            "read the session again before retrying"
        )


class PurgeRefused(SessionError):
    code = "purge_refused"

    def __init__(self, why: str) -> None:
        super().__init__(f"the checkpointer refused: {why}")
