"""The decider kernel's errors: one root; each says what the caller can do about it."""

from fleet_mesh.store import StoreError


class DeciderError(StoreError):
    """Root of the decider kernel's errors (a store error: the log could not take the event)."""


class Contended(DeciderError):
    """The subject kept moving under every attempt: nothing of this request was stored by this
    try; resending the same request (same request id) is safe and is answered exactly once."""

    def __init__(self, subject: str, attempts: int, request_id: str | None) -> None:
        again = (
            f"retry the same request (request_id {request_id!r}): it will be answered exactly once"
            if request_id
            else "decide again on a fresh fold"
        )
        super().__init__(f"{subject} kept changing under {attempts} attempts; {again}")
        self.subject = subject
        self.request_id = request_id


class IdUsedElsewhere(DeciderError):
    """The request's event id is already stored on another subject of the stream (ids are
    unique stream-wide): the request reused an id; a new request needs a new id."""

    def __init__(self, subject: str, request_id: str) -> None:
        super().__init__(
            f"request_id {request_id!r} was already used for a request on another ledger than "
            f"{subject}; every request needs its own request_id"
        )
        self.subject = subject
        self.request_id = request_id
