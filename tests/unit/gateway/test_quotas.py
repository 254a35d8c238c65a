"""The per-tenant request rate: a burst, then 429 with the wait in Retry-After; tenants do not
share a bucket; tokens come back at the rate."""

import pytest

from fleet_gateway.errors import ApiError
from fleet_gateway.quotas import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _limiter(rate: float, burst: float, clock: Clock) -> RateLimiter:
    return RateLimiter(rate, burst, clock=clock)


def test_a_tenant_gets_its_burst_then_429_saying_when_to_retry() -> None:
    clock = Clock()
    limiter = _limiter(rate=2, burst=3, clock=clock)
    for _ in range(3):
        limiter.charge("acme")
    with pytest.raises(ApiError) as over:
        limiter.charge("acme")
    assert over.value.status == 429
    assert over.value.code == "rate_limited"
    assert over.value.headers["Retry-After"] == "1"
    assert "'acme' is over 2 requests/s" in over.value.message
    limiter.charge("globex")  # another tenant's bucket is full


def test_tokens_come_back_at_the_rate_and_never_beyond_the_burst() -> None:
    clock = Clock()
    limiter = _limiter(rate=1, burst=2, clock=clock)
    limiter.charge("acme")
    limiter.charge("acme")
    clock.now += 1.0
    limiter.charge("acme")  # one token back after a second
    with pytest.raises(ApiError):
        limiter.charge("acme")
    clock.now += 3600
    limiter.charge("acme")
    limiter.charge("acme")
    with pytest.raises(ApiError):  # an hour idle still holds only the burst
        limiter.charge("acme")


def test_a_slow_rate_says_the_whole_wait() -> None:
    clock = Clock()
    limiter = _limiter(rate=0.1, burst=1, clock=clock)
    limiter.charge("acme")
    with pytest.raises(ApiError) as over:
        limiter.charge("acme")
    assert over.value.headers["Retry-After"] == "10"
