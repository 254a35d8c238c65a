"""The kind of a failed model call, read from the exception's classes (never its prose), and
the message a turn ends with: which profile and model, what to do, never the key."""

import socket

import pytest
from dspy import lm15

from fleet_agent.chat.react import RlmRouteFailed
from fleet_agent.llm_failures import (
    LLM_FAILURES,
    RATE_LIMIT_RETRIES,
    RETRY_AFTER_MAX_S,
    RETRY_AFTER_MIN_S,
    CallSite,
    LlmFailure,
    classify,
    retry_wait,
)
from fleet_agent.lm import LmCallFailed
from fleet_agent.lm_errors import retry_hook
from fleet_agent.run.failures import falls_back, stated
from fleet_agent.runners import Failed

SITE = CallSite(
    profile="main", model="openai/gpt-x", role="planner", secret="llm-main",
    api_base="http://10.0.0.5:8000/v1", timeout_s=20.0,
)  # fmt: skip
KEY = "sk-live-0123456789abcdef"


def chained(outer: BaseException, *inner: BaseException) -> BaseException:
    """`outer` raised from `inner[0]`, raised from `inner[1]`, ... as the engine raises them."""
    link = outer
    for cause in inner:
        link.__cause__ = cause
        link = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "code", "retryable"),
    [
        (lm15.RateLimitError("slow down", status=429, retry_after=2.0), "llm_rate_limited", True),
        (lm15.AuthError("bad key", status=401), "llm_auth_failed", False),
        (lm15.AuthError("forbidden", status=403), "llm_auth_failed", False),
        (lm15.BillingError("quota", status=429), "llm_quota_exceeded", False),
        (lm15.TimeoutError("timed out", status=408), "llm_timeout", True),
        (lm15.ServerError("boom", status=500), "llm_unavailable", True),
        (lm15.ServerError("down", status=503), "llm_unavailable", True),
        (lm15.ContextLengthError("too long", status=400), "llm_context_exceeded", False),
        (lm15.UnsupportedModelError("no model", status=404), "llm_model_not_found", False),
        (lm15.InvalidRequestError("bad", status=400), "llm_bad_request", False),
        (lm15.TransportError("reset"), "llm_unreachable", True),
        (lm15.ProviderError("odd", status=418), "llm_error", False),
        (RuntimeError("something else"), "llm_error", False),
    ],
)
def test_each_provider_failure_has_its_kind(exc: BaseException, code: str, retryable: bool) -> None:
    failure = classify(exc, SITE)
    assert failure.code == code
    assert failure.retryable is retryable
    assert code in LLM_FAILURES


def test_a_refused_connection_reported_as_a_500_is_unreachable() -> None:
    """litellm turns a refused connection into `InternalServerError` (HTTP 500), which dspy
    maps to a server error: the socket error in the cause chain says no server answered."""
    exc = chained(lm15.ServerError("Connection error.", status=500), ConnectionRefusedError(111))
    assert classify(exc, SITE).code == "llm_unreachable"
    dns = chained(lm15.ServerError("Connection error.", status=500), socket.gaierror(-2))
    assert classify(dns, SITE).code == "llm_unreachable"
    assert classify(lm15.ServerError("boom", status=500), SITE).code == "llm_unavailable"


def test_a_timeout_in_the_chain_is_not_taken_for_an_unreachable_server() -> None:
    exc = chained(lm15.TimeoutError("timed out", status=408), builtins_timeout())
    assert classify(exc, SITE).code == "llm_timeout"


def builtins_timeout() -> BaseException:
    return TimeoutError("read timed out")


def test_retry_after_and_status_are_read_from_the_error() -> None:
    failure = classify(lm15.RateLimitError("slow down", status=429, retry_after=3), SITE)
    assert (failure.status, failure.retry_after_s) == (429, 3.0)
    assert "retry after 3 s" in failure.message
    unknown = classify(lm15.RateLimitError("slow down", status=429), SITE)
    assert unknown.retry_after_s is None
    assert "retry in a while" in unknown.message


@pytest.mark.parametrize("code", LLM_FAILURES)
def test_every_message_names_the_profile_and_says_what_to_do(code: str) -> None:
    message = LlmFailure(code=code, site=SITE, status=429).message
    assert "'main'" in message
    assert ": " in message  # what happened: what to do
    assert KEY not in message


def test_the_auth_message_names_the_secret_never_the_key() -> None:
    exc = lm15.AuthError(f"Incorrect API key provided: {KEY}", status=401)
    failure = classify(exc, SITE)
    assert failure.message == (
        "the provider refused the key for the model 'openai/gpt-x' of profile 'main' (role "
        "planner), HTTP 401: check the api_key of profile 'main' (its secret 'llm-main') and "
        "that the key may use this model"
    )
    keyless = classify(exc, CallSite(profile="local", model="m", role="planner"))
    assert "profile 'local' sends no key: store its api_key" in keyless.message


def test_the_timeout_message_names_the_profiles_timeout() -> None:
    message = classify(lm15.TimeoutError("t", status=408), SITE).message
    assert "did not answer within the profile's timeout of 20 s" in message
    assert "raise timeout_s of profile 'main'" in message


def test_a_gateway_timeout_is_not_blamed_on_the_profiles_timeout() -> None:
    message = classify(lm15.TimeoutError("t", status=504), SITE).message
    assert "timed out before answering, HTTP 504" in message
    assert "timeout_s" not in message  # raising ours would not help


def test_the_unreachable_message_names_the_address() -> None:
    message = LlmFailure(code="llm_unreachable", site=SITE).message
    assert "the server of profile 'main' at http://10.0.0.5:8000/v1 cannot be reached" in message


def test_only_a_short_known_rate_limit_is_retried_within_the_deadline() -> None:
    def limited(after: float | None) -> LlmFailure:
        return LlmFailure(code="llm_rate_limited", site=SITE, retry_after_s=after)

    assert retry_wait(limited(1.5), 0, None) == 1.5
    assert retry_wait(limited(0.0), 0, None) == RETRY_AFTER_MIN_S  # recorded as retried
    assert retry_wait(limited(1.5), RATE_LIMIT_RETRIES - 1, None) == 1.5
    assert retry_wait(limited(1.5), RATE_LIMIT_RETRIES, None) is None  # bounded
    assert retry_wait(limited(RETRY_AFTER_MAX_S + 1), 0, None) is None  # too long a wait
    assert retry_wait(limited(None), 0, None) is None  # no hint: no guess
    assert retry_wait(limited(5.0), 0, 5.0) is None  # would end past the run's deadline
    assert retry_wait(limited(5.0), 0, 6.0) == 5.0
    auth = LlmFailure(code="llm_auth_failed", site=SITE, retry_after_s=1.0)
    assert retry_wait(auth, 0, None) is None  # a refused key is never asked again
    timeout = LlmFailure(code="llm_timeout", site=SITE, retry_after_s=1.0)
    assert retry_wait(timeout, 0, None) is None


def test_the_call_error_starts_with_its_kind_and_keeps_the_scrubbed_provider_text() -> None:
    failure = LlmFailure(code="llm_auth_failed", site=SITE, status=401)
    error = LmCallFailed("AuthError: Incorrect API key provided: ***", failure)
    text = str(error)
    assert text.startswith("llm_auth_failed: the provider refused the key for the model")
    assert text.endswith("(the provider said: AuthError: Incorrect API key provided: ***)")
    assert str(LmCallFailed("plain")) == "plain"  # no kind: as before


def test_the_failure_is_found_behind_dspys_own_error() -> None:
    failure = LlmFailure(code="llm_timeout", site=SITE)
    inner = LmCallFailed("Timeout", failure)
    outer = chained(RuntimeError("dspy wrapped it"), inner)
    assert stated(outer) == Failed(failure.message, code="llm_timeout", retryable=True)
    assert stated(RuntimeError("no model call")) is None
    assert stated(LmCallFailed("recorded before kinds existed")) is None


def test_stamina_is_told_to_wait_only_for_what_the_call_chose() -> None:
    failure = LlmFailure(code="llm_rate_limited", site=SITE, retry_after_s=1.0)
    assert retry_hook(LmCallFailed("429", failure, retry_in_s=1.0)) == 1.0
    assert retry_hook(LmCallFailed("429", failure)) is False
    assert retry_hook(RuntimeError("x")) is False


def test_the_chat_turn_ends_with_the_kind_and_falls_back_only_where_that_may_help() -> None:
    def failed(code: str) -> LmCallFailed:
        return LmCallFailed("provider text", LlmFailure(code=code, site=SITE))

    ended = stated(failed("llm_rate_limited"))
    assert ended is not None
    assert (ended.code, ended.retryable) == ("llm_rate_limited", True)
    assert "provider text" not in ended.error
    for code in ("llm_auth_failed", "llm_rate_limited", "llm_unreachable", "llm_quota_exceeded"):
        assert not falls_back(failed(code)), code
    for code in ("llm_timeout", "llm_unavailable", "llm_context_exceeded", "llm_bad_request"):
        assert falls_back(failed(code)), code
    assert falls_back(RuntimeError("not a model call"))
    route = RlmRouteFailed("the route's message", "llm_auth_failed", False)
    ended = stated(route)
    assert ended is not None
    assert (ended.error, ended.code, ended.retryable) == (
        "the route's message", "llm_auth_failed", False,
    )  # fmt: skip
    assert not falls_back(route)
    assert stated(RlmRouteFailed("no answer")) is None
