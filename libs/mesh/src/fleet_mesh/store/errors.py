"""The event store's errors: one root, and a family a caller can act on."""


class StoreError(Exception):
    """Root of the event store's errors."""


class AppendConflict(StoreError):
    """Someone else appended to the subject first: reload, decide again, retry."""

    def __init__(
        self, subject: str, expected: int, detail: str, *, actual: int | None = None
    ) -> None:
        super().__init__(f"append to {subject} expected last sequence {expected}: {detail}")
        self.subject = subject
        self.expected = expected
        self.actual = actual  # the subject's last sequence when the conflict was read back


class DuplicateElsewhere(StoreError):
    """An event id already stored on another subject: ids are unique across a stream."""


class DuplicateInBatch(AppendConflict):
    """A batch holds an id the stream already has, and the subject did not move: reloading
    will not help. Append its events one at a time to find the one that is not new."""


class WrongSubject(StoreError, ValueError):
    """The envelope names a tenant, session or run other than the subject it is appended to."""


class StoreUnavailable(StoreError):
    """The server did not answer in time; the operation may or may not have happened."""
