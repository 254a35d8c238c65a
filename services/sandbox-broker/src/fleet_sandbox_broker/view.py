"""Every tenant's sandboxes as the SANDBOXES stream says, kept current by a live subscription.

`list`, the tenant quota, `resume` and the takeover at start read this instead of replaying a
tenant's stream per request (issue 8: 2,000 `list` calls replaying gave 436 timeouts and a
700 ms ping). It is folded by `domain.evolve`, the same fold a replay would use, from the start
of the stream and then as events land; a read first waits until the view has seen the stream's
last sequence as of that read, so an answer never misses an event stored before the request.
"""

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from nats.js import JetStreamContext

from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_mesh.store import EventStore, Head
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.errors import Unavailable

log = logging.getLogger("fleet.sandbox.view")

CATCH_UP_S = 5.0


class SandboxesView:
    def __init__(self, js: JetStreamContext, store: EventStore, stream: str) -> None:
        self._js = js
        self._store = store
        self._stream = stream
        self._tenants: dict[str, dict[str, domain.SandboxView]] = {}
        self._heads: dict[str, Head] = {}  # per sandbox subject: for claims on it
        self.seq = 0
        self._moved = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Follow the stream from its start; return once caught up with its head now."""
        self._task = asyncio.create_task(self._follow(), name="sandboxes-view")
        await self.caught_up(timeout=60.0)

    async def _follow(self) -> None:
        async for stored in self._store.subscribe(streams.SANDBOXES.subjects[0]):
            tenant = stored.envelope.tenant
            views = self._tenants.setdefault(tenant, {})
            domain.evolve(views, tenant, stored.envelope.data, stored.seq)
            self._heads[stored.subject] = Head(stored.seq, stored.hash)
            for sandbox in [s for s, v in views.items() if v.status == "deleted"]:
                del views[sandbox]  # nothing later can bring it back: keep the view small
                self._heads.pop(sb.sandbox_subject(tenant, sandbox), None)
            async with self._moved:
                self.seq = stored.seq
                self._moved.notify_all()

    async def caught_up(self, timeout: float = CATCH_UP_S) -> None:
        """Wait until every event stored before this call is folded in."""
        info = await self._js.stream_info(self._stream)
        await self.reached(info.state.last_seq, timeout)

    async def reached(self, target: int, timeout: float = CATCH_UP_S) -> None:
        """Wait until the event at stream sequence `target` is folded in."""
        if self.seq >= target:
            return
        try:
            async with self._moved:
                await asyncio.wait_for(self._moved.wait_for(lambda: self.seq >= target), timeout)
        except TimeoutError:
            if self._task is not None and self._task.done() and not self._task.cancelled():
                log.error("the sandboxes view stopped", exc_info=self._task.exception())
            raise Unavailable(
                f"the broker's view of the sandbox log is behind (at {self.seq} of {target}); "
                "retry shortly"
            ) from None

    def of(self, tenant: str) -> dict[str, domain.SandboxView]:
        return self._tenants.get(tenant, {})

    def get(self, tenant: str, sandbox: str) -> domain.SandboxView | None:
        return self.of(tenant).get(sandbox)

    def live(self, tenant: str) -> int:
        return len(self.of(tenant))

    def everyone(self) -> Iterator[domain.SandboxView]:
        for views in list(self._tenants.values()):
            yield from list(views.values())

    def head(self, tenant: str, sandbox: str) -> Head | None:
        return self._heads.get(sb.sandbox_subject(tenant, sandbox))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
