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
- **Upload bytes**: shared, a byte bucket per tenant in the gateway KV (`UploadQuota`),
  charged by the document and checkout uploads before anything is stored, and given back
  (`UploadQuota.held`) when the upload then fails (the object store, the broker or the log):
  only an upload that was kept costs its bytes.
"""

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from fleet_gateway.errors import ApiError

log = logging.getLogger(__name__)


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


# Upload bytes: one allowance per tenant, shared by every replica through the gateway's KV
# bucket (`uploads.<tenant>`), because what it protects (the object store) is shared too. An
# upload is rare and large, so the compare-and-set round trip it costs is nothing beside it.


class Allowance(msgspec.Struct, frozen=True):
    """A tenant's upload bucket as stored: `bytes` left at wall time `at`."""

    bytes: float
    at: float


def give_bytes(
    held: Allowance | None, now: float, size: int, capacity: int, window_s: float
) -> Allowance:
    """`held` refilled to `now` with `size` bytes given back (never above capacity)."""
    level = (
        float(capacity)
        if held is None
        else held.bytes + max(0.0, now - held.at) * (capacity / window_s)
    )
    return Allowance(min(float(capacity), level + size), now)


def take_bytes(
    held: Allowance | None, now: float, size: int, capacity: int, window_s: float
) -> tuple[Allowance, float]:
    """Refill `held` to `now` (capacity per window, never above it) and take `size` bytes:
    (the bucket after, 0.0) when it held enough, else (the bucket refilled, the seconds until
    it will). A tenant never seen starts full."""
    rate = capacity / window_s
    level = float(capacity) if held is None else held.bytes + max(0.0, now - held.at) * rate
    level = min(float(capacity), level)
    if level >= size:
        return Allowance(level - size, now), 0.0
    return Allowance(level, now), (size - level) / rate


UPLOAD_TRIES = 10


class UploadQuota:
    """`charge(tenant, size, what)` before an upload is stored: 429 `upload_quota_exceeded`
    with `Retry-After` when the tenant's allowance is short, 413 `upload_over_quota` when
    the upload is bigger than the whole allowance (waiting would never help)."""

    def __init__(self, kv: KeyValue, capacity: int, window_s: float) -> None:
        self._kv, self.capacity, self.window_s = kv, capacity, window_s

    @contextlib.asynccontextmanager
    async def held(self, tenant: str, size: int, what: str) -> AsyncIterator[None]:
        """`charge`, then the upload's work in the block: when the block fails, the bytes are
        given back before the failure goes on (an upload not kept costs nothing)."""
        await self.charge(tenant, size, what)
        try:
            yield
        except BaseException:
            await self.refund(tenant, size)
            raise

    async def refund(self, tenant: str, size: int) -> bool:
        """Give `size` bytes back to the tenant's allowance (compare-and-set, retried). Best
        effort: when the KV does not answer, the refund is logged and lost (the tenant is
        short until the allowance refills), and the upload's own failure is what the caller
        hears. Answers whether it was given back."""
        key = f"uploads.{tenant}"
        for _ in range(UPLOAD_TRIES):
            try:
                try:
                    entry = await self._kv.get(key)
                except KeyNotFoundError:
                    held, revision = None, None
                else:
                    held = msgspec.json.decode(entry.value or b"", type=Allowance)
                    revision = entry.revision
                after = give_bytes(held, time.time(), size, self.capacity, self.window_s)
                value = msgspec.json.encode(after)
                if revision is None:
                    await self._kv.create(key, value)
                else:
                    await self._kv.update(key, value, last=revision)
                return True
            except (KeyWrongLastSequenceError, APIError):  # another upload moved it first
                continue
            except (NatsError, TimeoutError) as exc:
                log.warning(
                    "upload allowance refund of %d bytes for tenant %s lost: %s",
                    size, tenant, type(exc).__name__,
                )  # fmt: skip
                return False
        log.warning("upload allowance refund of %d bytes for tenant %s lost: busy", size, tenant)
        return False

    async def charge(self, tenant: str, size: int, what: str) -> None:
        if size > self.capacity:
            raise ApiError(
                413,
                "upload_over_quota",
                f"the {what} is {size} bytes, more than tenant {tenant!r}'s whole upload "
                f"allowance of {self.capacity} bytes per {self.window_s:g} s: send it in "
                "smaller parts, or ask the operator to raise FLEET_GATEWAY_TENANT_UPLOAD_BYTES",
                details={"size": size, "allowance_bytes": self.capacity},
            )
        key = f"uploads.{tenant}"
        for _ in range(UPLOAD_TRIES):
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                held, revision = None, None
            except (NatsError, TimeoutError) as exc:
                raise ApiError(
                    503,
                    "quota_unavailable",
                    f"the upload allowance (the gateway's KV on NATS) did not answer "
                    f"({type(exc).__name__}); nothing was stored, retry shortly",
                    headers={"Retry-After": "1"},
                ) from exc
            else:
                held = msgspec.json.decode(entry.value or b"", type=Allowance)
                revision = entry.revision
            after, wait = take_bytes(held, time.time(), size, self.capacity, self.window_s)
            if wait > 0:
                raise ApiError(
                    429,
                    "upload_quota_exceeded",
                    f"tenant {tenant!r} has {int(after.bytes)} of its {self.capacity} upload "
                    f"bytes per {self.window_s:g} s left, and this {what} is {size} bytes; "
                    f"retry after {math.ceil(wait)} s",
                    details={
                        "size": size,
                        "remaining_bytes": int(after.bytes),
                        "allowance_bytes": self.capacity,
                        "window_s": self.window_s,
                    },
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
            value = msgspec.json.encode(after)
            try:
                if revision is None:
                    await self._kv.create(key, value)
                else:
                    await self._kv.update(key, value, last=revision)
                return
            except (KeyWrongLastSequenceError, APIError):  # another upload charged first
                continue
            except (NatsError, TimeoutError) as exc:
                raise ApiError(
                    503,
                    "quota_unavailable",
                    f"the upload allowance (the gateway's KV on NATS) did not answer "
                    f"({type(exc).__name__}); nothing was stored, retry shortly",
                    headers={"Retry-After": "1"},
                ) from exc
        raise ApiError(
            503,
            "quota_busy",
            f"tenant {tenant!r}'s upload allowance kept changing under {UPLOAD_TRIES} tries; retry",
            headers={"Retry-After": "1"},
        )
