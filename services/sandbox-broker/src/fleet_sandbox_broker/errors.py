"""One error root for the broker. Each maps to a stable RPC error code the caller can act on."""


class SandboxError(Exception):
    code = "sandbox_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SandboxNotFound(SandboxError):
    code = "not_found"


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
    code = "bad_request"
