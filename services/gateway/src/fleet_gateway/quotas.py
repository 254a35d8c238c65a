"""Per-tenant limits that answer 429 with `Retry-After`, so one tenant cannot crowd out the
others.

- **Requests per second**: a token bucket per tenant, per replica (`FLEET_GATEWAY_TENANT_RPS`,
  burst `FLEET_GATEWAY_TENANT_BURST`). Per replica on purpose: a shared counter would cost a
  round trip on every request to enforce a limit whose job is protecting this process; with
  N replicas behind a balancer a tenant gets about N times the rate (docs/gateway.md).
- **Concurrent turns**: shared, because it is read from the log: the tenant's queued and
  running turns in this replica's read models, folded from the one log every replica folds
  (`FLEET_GATEWAY_TENANT_CONCURRENT_TURNS`). Two requests landing on two replicas in the same
  instant can both pass (each folded the other's only later): the overshoot is bounded by the
  number of replicas, and the agent's one-turn-per-session rule still holds exactly.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleet_gateway.errors import ApiError


@dataclass
class _Bucket:
    tokens: float
    at: float


MAX_TENANTS = 100_000


@dataclass
class RateLimiter:
    rate: float
    burst: float
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def charge(self, tenant: str) -> None:
        """Take one token for `tenant`, or raise 429 saying when the next one comes."""
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            if len(self._buckets) >= MAX_TENANTS:  # bounded memory: forget idle tenants
                self._buckets = {
                    k: b for k, b in self._buckets.items() if now - b.at < self.burst / self.rate
                }
            bucket = self._buckets[tenant] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens < 1:
            wait = (1 - bucket.tokens) / self.rate
            raise ApiError(
                429,
                "rate_limited",
                f"tenant {tenant!r} is over {self.rate:g} requests/s (burst {self.burst:g}) on "
                f"this gateway replica; retry after {math.ceil(wait)} s",
                details={"limit_per_s": self.rate, "burst": self.burst},
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        bucket.tokens -= 1


def turns_over_quota(tenant: str, active: int, limit: int) -> ApiError:
    return ApiError(
        429,
        "too_many_turns",
        f"tenant {tenant!r} has {active} turns queued or running, its limit is {limit}: wait "
        "for one to end (or cancel one) and ask again",
        details={"active_turns": active, "limit": limit},
        headers={"Retry-After": "2"},
    )
