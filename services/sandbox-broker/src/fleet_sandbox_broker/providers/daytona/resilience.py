"""Daytona's failures in the broker's terms: error families with advice, retries, a circuit.

The SDK never retries; a 429 or a 5xx storm would otherwise surface as a failed turn, or a
hung one. Transient answers are retried with backoff (honouring `Retry-After`), every call has
a deadline, and a run of failures opens a circuit so turns fail fast with `unavailable` and
`/ready` can say Daytona is degraded instead of waiting on it.
"""

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import stamina
from daytona import DaytonaError

from fleet_sandbox_broker.errors import (
    BadSpec,
    Conflict,
    ForkFailed,
    SandboxError,
    SandboxNotFound,
    Unavailable,
)

T = TypeVar("T")
TRANSIENT = frozenset({429, 500, 502, 503, 504})


def status_of(exc: BaseException) -> int | None:
    """The HTTP status behind an SDK error: the toolbox paths that stream (file transfers)
    raise a bare `DaytonaError` whose cause is aiohttp's response error."""
    seen: BaseException | None = exc
    while seen is not None:
        status = getattr(seen, "status_code", None) or getattr(seen, "status", None)
        if isinstance(status, int):
            return status
        seen = seen.__cause__
    return None


def retry_after(exc: BaseException) -> bool | float:
    """stamina's hook: retry 429/5xx, waiting what `Retry-After` asks when it says."""
    if not isinstance(exc, DaytonaError) or status_of(exc) not in TRANSIENT:
        return False
    raw = {k.lower(): v for k, v in exc.headers.items()}.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw is not None else True
    except ValueError:
        return True


def translate(exc: DaytonaError, what: str) -> SandboxError:
    """One SDK error as the broker's family, saying what the user can do about it."""
    status = status_of(exc)
    if status == 404:
        return SandboxNotFound(
            f"{what}: not found on Daytona (no such file, or the sandbox was deleted or "
            "removed by its auto-delete interval: then create a new sandbox)"
        )
    if status == 422 and what.startswith("fork"):
        return ForkFailed(
            f"{what}: Daytona forks only linux-vm sandboxes (this one is container-class); "
            "use a VM snapshot (FLEET_DAYTONA_SNAPSHOT) or let the policy build a clean child"
        )
    if status == 409:
        return Conflict(
            f"{what}: Daytona refused it in the sandbox's current state ({exc}); a parent "
            "with live forks is deleted after them"
        )
    if status in (400, 422):
        return BadSpec(f"{what}: Daytona refused the request as malformed: {exc}")
    if status in (401, 403):
        return SandboxError(
            f"{what}: Daytona refused the credentials ({status}); check DAYTONA_API_KEY and "
            "that the key's organisation may use DAYTONA_TARGET"
        )
    if status in TRANSIENT:
        return Unavailable(f"{what}: Daytona is overloaded or failing ({status}); retry later")
    return Unavailable(f"{what}: Daytona call failed ({exc}); retry later")


@dataclass
class Circuit:
    """Opens after `threshold` consecutive transient failures, for `cool_s`; then one probe."""

    threshold: int = 5
    cool_s: float = 30.0
    failures: int = 0
    opened_at: float | None = None
    last_error: str = ""
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def degraded(self) -> bool:
        return self.opened_at is not None and time.monotonic() - self.opened_at < self.cool_s

    def health(self) -> dict[str, object]:
        """The shape `/ready` and `runtime/tests/daytona` report."""
        ok = not self.degraded
        last = self.latencies_ms[-1] if self.latencies_ms else None
        return {
            "ok": ok,
            "checks": {
                "circuit": "closed" if ok else "open",
                "consecutive_failures": self.failures,
            },
            "guidance": ""
            if ok
            else (
                f"Daytona failed {self.failures} calls in a row ({self.last_error}); sandbox "
                f"calls fail fast for {self.cool_s:g} s, then one is let through to probe"
            ),
            "latency_ms": last,
        }

    def record(self, ok: bool, latency_ms: float, error: str = "") -> None:
        self.latencies_ms = [*self.latencies_ms[-63:], latency_ms]
        if ok:
            self.failures, self.opened_at, self.last_error = 0, None, ""
            return
        self.failures += 1
        self.last_error = error
        if self.failures >= self.threshold:
            self.opened_at = time.monotonic()


@dataclass
class Caller:
    """Runs one SDK call with retries, a deadline and the circuit; raises the broker's errors."""

    circuit: Circuit
    attempts: int = 5
    deadline_s: float = 60.0
    wait_max_s: float = 10.0

    async def __call__(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        if self.circuit.degraded:
            raise Unavailable(
                f"{what}: Daytona is degraded ({self.circuit.last_error}); retry later"
            )
        started = time.monotonic()
        try:
            async for attempt in stamina.retry_context(
                on=retry_after,
                attempts=self.attempts,
                timeout=self.deadline_s,
                wait_initial=0.05,
                wait_jitter=0.1,
                wait_max=self.wait_max_s,
            ):
                with attempt:
                    result = await call()
        except DaytonaError as exc:
            status = status_of(exc)
            transient = status in TRANSIENT or status is None
            self.circuit.record(not transient, _ms(started), f"{status}: {exc}")
            raise translate(exc, what) from exc
        self.circuit.record(True, _ms(started))
        return result


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000
