"""The per-tenant request rate: a burst, then 429 with the wait in Retry-After; tenants do not
share a bucket; tokens come back at the rate."""

import pytest

from fleet_gateway.errors import ApiError
from fleet_gateway.quotas import Allowance, RateLimiter, take_bytes


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


def test_an_upload_allowance_starts_full_refills_over_its_window_and_never_beyond() -> None:
    after, wait = take_bytes(None, 100.0, 600, capacity=1000, window_s=100.0)
    assert (after, wait) == (Allowance(400.0, 100.0), 0.0)
    short, wait = take_bytes(after, 100.0, 600, capacity=1000, window_s=100.0)
    assert short == Allowance(400.0, 100.0)
    assert wait == pytest.approx(20.0)  # 200 bytes short at 10 bytes/s
    later, wait = take_bytes(after, 120.0, 600, capacity=1000, window_s=100.0)
    assert (later, wait) == (Allowance(0.0, 120.0), 0.0)
    idle, _ = take_bytes(later, 10_000.0, 0, capacity=1000, window_s=100.0)
    assert idle.bytes == 1000.0
    # a clock that went back (another replica's) never adds bytes
    back, _ = take_bytes(Allowance(10.0, 50.0), 40.0, 0, capacity=1000, window_s=100.0)
    assert back.bytes == 10.0
