"""What a failed model call was, named for programs and said for people. Pure: no I/O.

The earlier system's clients tell a model that timed out or was rate-limited from an agent
that broke (`llm_timeout`, `llm_rate_limited`); a turn that ends on a provider's refusal must
say which, which profile and model, and what to do, or the user cannot act on it.

The kind is read from the exception's classes, never its prose: dspy's LiteLLM engine maps
the provider's answer to lm15's error family (status, provider code, `Retry-After`), and the
one it leaves wrong (a refused connection arrives as litellm's `InternalServerError`, HTTP
500) is told apart by the socket error in its cause chain. The message is built here from the
profile, never from the provider's text, which may echo the key (the scrubbed provider text
stays in the call's `run.llm_called` record and the replica's log).

The budgeted LM asks again by itself in one case only (`retry_wait`): the provider rate-limited
the call and said when to come back (`Retry-After`), that wait is short (at most
`RETRY_AFTER_MAX_S`), fewer than `RATE_LIMIT_RETRIES` retries were made, and the wait ends
before the run's deadline. Each retry is a call of its own: granted by the budget, recorded as
`run.llm_called`. A refused key, a timeout (its wait was already the profile's whole timeout) or
a server error is never retried here; a rate limit with no `Retry-After` neither (we would only
guess how long to wait).

Each kind says whether asking again later may help (`retryable`, the turn's flag) and whether
the chat agent's fallback to a cheaper module may (`falls_back`): a smaller prompt helps a
timeout or a context that did not fit, not a refused key or an unreachable server. Both are
read from the failure family's one table (`run.failures.CODES`); this module only tells which
kind a provider's exception is, and words its message.
"""

import builtins
import socket
from dataclasses import dataclass

from dspy import lm15

from fleet_agent.run.failures import code_of
from fleet_events.llm import LLM_FAILURES

RATE_LIMIT_RETRIES = 2
RETRY_AFTER_MAX_S = 10.0
RETRY_AFTER_MIN_S = 0.1
"""A `Retry-After: 0` still waits this long: a wait of 0 would read as "not asked again"."""


@dataclass(frozen=True)
class CallSite:
    """The call as the profile made it: what a message may name (never the key)."""

    profile: str
    model: str
    role: str
    secret: str | None = None
    api_base: str | None = None
    timeout_s: float = 60.0


@dataclass(frozen=True)
class LlmFailure:
    code: str
    site: CallSite
    status: int | None = None
    retry_after_s: float | None = None
    detail: str = ""
    """The whole message when the agent itself cut the call (`lm.CallCut`: what was slow,
    the tokens so far, the speed, and what to do)."""

    @property
    def retryable(self) -> bool:
        return code_of(self.code).retryable

    @property
    def falls_back(self) -> bool:
        return code_of(self.code).falls_back

    @property
    def message(self) -> str:
        """What happened, to which profile and model, and what to do."""
        if self.detail:
            return f"the {_where(self)}: {self.detail}"
        return _MESSAGES[self.code](self)


def classify(exc: BaseException, site: CallSite) -> LlmFailure:
    """The kind of failure `exc` (raised by the model call at `site`) is."""
    status = _status(exc)
    retry_after = _retry_after(exc)
    code = _code(exc, status)
    return LlmFailure(code=code, site=site, status=status, retry_after_s=retry_after)


def retry_wait(failure: LlmFailure, retries: int, time_left_s: float | None) -> float | None:
    """How long to wait before asking again (None: do not), after `retries` retries of this
    call; `time_left_s` is what remains of the run's deadline (None: it has none)."""
    wait = failure.retry_after_s
    if failure.code != "llm_rate_limited" or wait is None or wait > RETRY_AFTER_MAX_S:
        return None
    if retries >= RATE_LIMIT_RETRIES:
        return None
    wait = max(wait, RETRY_AFTER_MIN_S)
    if time_left_s is not None and wait >= time_left_s:
        return None
    return wait


def _code(exc: BaseException, status: int | None) -> str:
    if _unreachable(exc):
        return "llm_unreachable"
    for kind, code in _BY_CLASS:
        if isinstance(exc, kind):
            return code
    if isinstance(exc, builtins.TimeoutError):
        return "llm_timeout"
    return _BY_STATUS.get(status or 0, "llm_unavailable" if (status or 0) >= 500 else "llm_error")


_BY_CLASS: tuple[tuple[type[BaseException], str], ...] = (
    (lm15.ContextLengthError, "llm_context_exceeded"),
    (lm15.UnsupportedModelError, "llm_model_not_found"),
    (lm15.AuthError, "llm_auth_failed"),
    (lm15.BillingError, "llm_quota_exceeded"),
    (lm15.RateLimitError, "llm_rate_limited"),
    (lm15.TimeoutError, "llm_timeout"),
    (lm15.InvalidRequestError, "llm_bad_request"),
    (lm15.ServerError, "llm_unavailable"),
    (lm15.TransportError, "llm_unreachable"),
)
_BY_STATUS = {401: "llm_auth_failed", 403: "llm_auth_failed", 402: "llm_quota_exceeded",
              404: "llm_model_not_found", 408: "llm_timeout", 429: "llm_rate_limited",
              504: "llm_timeout", 400: "llm_bad_request", 422: "llm_bad_request"}  # fmt: skip


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(seen) < 16 and link not in seen:
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen


def _unreachable(exc: BaseException) -> bool:
    """No connection was made: refused, reset before an answer, or a name that does not
    resolve. litellm reports these as a 500 from the server, which never answered."""
    return any(
        isinstance(link, ConnectionError | socket.gaierror)
        and not isinstance(link, builtins.TimeoutError)
        for link in _chain(exc)
    )


def _status(exc: BaseException) -> int | None:
    for link in _chain(exc):
        status = getattr(link, "status", None) or getattr(link, "status_code", None)
        if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
            return status
    return None


def _retry_after(exc: BaseException) -> float | None:
    for link in _chain(exc):
        value = getattr(link, "retry_after", None)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
    return None


# -- the messages --------------------------------------------------------------------------


def _where(f: LlmFailure) -> str:
    return f"model {f.site.model!r} of profile {f.site.profile!r} (role {f.site.role})"


def _http(f: LlmFailure) -> str:
    return f", HTTP {f.status}" if f.status is not None else ""


def _timeout(f: LlmFailure) -> str:
    # litellm marks our own client timeout 408; a 504 is a gateway before the model giving up
    if f.status == 504:
        return (
            f"the server of the {_where(f)} timed out before answering{_http(f)}: ask again; "
            "if it keeps happening, use a faster model or ask its operator (a proxy in front "
            "of the model may time out sooner than the model answers)"
        )
    return (
        f"the {_where(f)} did not answer within the profile's timeout of {f.site.timeout_s:g} s"
        f": ask again; if it keeps happening, raise timeout_s of profile {f.site.profile!r} "
        "or use a faster model"
    )


def _rate_limited(f: LlmFailure) -> str:
    when = (
        f"retry after {f.retry_after_s:g} s" if f.retry_after_s is not None else "retry in a while"
    )
    return (
        f"the provider of the {_where(f)} is rate-limiting calls (HTTP 429): the provider "
        f"asked to slow down; {when}, or raise the rate limit of the account behind profile "
        f"{f.site.profile!r}"
    )


def _quota(f: LlmFailure) -> str:
    return (
        f"the provider refused the {_where(f)} for billing or quota{_http(f)}: check the plan "
        f"and credit of the account whose key profile {f.site.profile!r} uses"
    )


def _auth(f: LlmFailure) -> str:
    secret = f.site.secret
    fix = (
        f"check the api_key of profile {f.site.profile!r} (its secret {secret!r}) and that "
        "the key may use this model"
        if secret
        else f"profile {f.site.profile!r} sends no key: store its api_key"
    )
    return f"the provider refused the key for the {_where(f)}{_http(f)}: {fix}"


def _unreachable_message(f: LlmFailure) -> str:
    at = f" at {f.site.api_base}" if f.site.api_base else ""
    return (
        f"the server of profile {f.site.profile!r}{at} cannot be reached (connection refused, "
        f"reset or its name does not resolve): check api_base of profile {f.site.profile!r} "
        "and that the server is running"
    )


def _unavailable(f: LlmFailure) -> str:
    return (
        f"the server of the {_where(f)} failed{_http(f)}: it is down or overloaded; ask again later"
    )


def _context(f: LlmFailure) -> str:
    return (
        f"the prompt is longer than the context window of the {_where(f)}: shorten the "
        "message or what it attaches, start a new session, or bind the role to a model with "
        "a longer context"
    )


def _not_found(f: LlmFailure) -> str:
    return (
        f"the server of profile {f.site.profile!r} has no model {f.site.model!r}{_http(f)}: "
        f"check the model name of profile {f.site.profile!r}"
    )


def _bad_request(f: LlmFailure) -> str:
    return (
        f"the server of the {_where(f)} refused the request as invalid{_http(f)}: check the "
        f"model, max_tokens and server_kind of profile {f.site.profile!r}"
    )


def _other(f: LlmFailure) -> str:
    return (
        f"the call to the {_where(f)} failed{_http(f)}: the run's record (run.llm_called) has "
        "the provider's answer"
    )


_MESSAGES = {
    "llm_timeout": _timeout,
    "llm_rate_limited": _rate_limited,
    "llm_quota_exceeded": _quota,
    "llm_auth_failed": _auth,
    "llm_unreachable": _unreachable_message,
    "llm_unavailable": _unavailable,
    "llm_context_exceeded": _context,
    "llm_model_not_found": _not_found,
    "llm_bad_request": _bad_request,
    "llm_error": _other,
}


__all__ = [
    "LLM_FAILURES",
    "RATE_LIMIT_RETRIES",
    "RETRY_AFTER_MAX_S",
    "CallSite",
    "LlmFailure",
    "classify",
    "retry_wait",
]
