"""One error root for the broker. Each maps to a stable RPC error code the caller can act on
(subscribers.py does the mapping; nothing below it speaks RPC)."""


class SandboxError(Exception):
    code = "sandbox_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SandboxNotFound(SandboxError):
    code = "not_found"


class ContextNotOpen(SandboxNotFound):
    """The sandbox is held but not the REPL context asked for: never opened, closed, or lost
    with the memory of a sandbox revived in place after a broker restart (its caller can open
    it again and rebuild it)."""

    code = "no_context"


class SandboxStopped(SandboxError):
    """The sandbox's processes are gone (a limit, a crash, a protocol violation, a delete)."""

    code = "stopped"


class ProtocolViolation(SandboxError):
    code = "protocol"


class ForkFailed(SandboxError):
    code = "fork_failed"


class PathRefused(SandboxError):
    code = "path_refused"


class TooLarge(SandboxError):
    code = "too_large"


class BadSpec(SandboxError):
    """Malformed input the edge lets through (limits out of bounds, a bad cursor): it stores
    nothing and says which field, which value and what is allowed."""

    code = "bad_request"


class Conflict(SandboxError):
    """A request id reused with a different body: the first body's answer is not this one's."""

    code = "conflict"


class QuotaExceeded(SandboxError):
    """A tenant already holds as many live sandboxes as it may."""

    code = "quota"


class Unavailable(SandboxError):
    """Retry later: the broker cannot answer correctly yet (its view of the log lags)."""

    code = "unavailable"


class ProviderNotConfigured(SandboxError):
    """The tenant's `sandbox_provider` names a provider this broker was not given settings for
    (a well-formed request the deployment declines: recorded as `sandbox.create_refused`)."""

    code = "provider_not_configured"

    def __init__(self, message: str, provider: str) -> None:
        super().__init__(message)
        self.provider = provider
