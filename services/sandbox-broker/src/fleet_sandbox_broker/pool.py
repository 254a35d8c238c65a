"""A warm pool of started clean sandboxes (no repository, no volume, default limits).

Clean creates that fit take one (it only needs a tenant, labels and a `sandbox.created` event);
a background task refills the pool to its size. A pooled sandbox belongs to no tenant and
appears in no log until it is taken.
"""

import asyncio
import contextlib
import logging

from fleet_events.envelope import new_id
from fleet_events.sandbox import Limits
from fleet_sandbox_broker.providers.base import Provider, Sandbox

log = logging.getLogger("fleet.sandbox.pool")


class WarmPool:
    def __init__(self, provider: Provider, size: int, limits: Limits) -> None:
        self.provider = provider
        self.size = size
        self.limits = limits
        self._ready: list[Sandbox] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.refills = 0

    def start(self) -> None:
        if self.size > 0:
            self._task = asyncio.create_task(self._refill(), name="warm-pool")
            self._wake.set()

    @property
    def ready(self) -> int:
        return len(self._ready)

    def take(self) -> Sandbox | None:
        while self._ready:
            box = self._ready.pop()
            self._wake.set()
            if box.running:
                return box
        self._wake.set()
        return None

    async def _refill(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while len(self._ready) < self.size:
                try:
                    box = await self.provider.create(new_id(), self.limits)
                except Exception:
                    log.exception("warm pool could not start a sandbox")
                    break
                self._ready.append(box)
                self.refills += 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*(box.destroy() for box in self._ready), return_exceptions=True)
        self._ready.clear()
