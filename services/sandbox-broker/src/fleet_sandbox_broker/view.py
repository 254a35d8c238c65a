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
from nats.js.api import ConsumerConfig, DeliverPolicy

from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.binding import subject_tenant
from fleet_events.chain import HASH_HEADER
from fleet_events.codec import Codec, CodecError
from fleet_events.envelope import Event
from fleet_mesh.store import Head
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.errors import Unavailable

log = logging.getLogger("fleet.sandbox.view")

CATCH_UP_S = 5.0


class SandboxesView:
    def __init__(self, js: JetStreamContext, codec: Codec) -> None:
        self._js = js
        self._codec = codec
        self._stream = streams.SANDBOXES.name
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
        """An ordered consumer from the stream's start (the client recreates it from the last
        sequence seen if a message goes missing). An event this broker cannot read (written
        by a newer one, say) is logged and skipped: one bad event must not stop every list."""
        start = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=1)
        sub = await self._js.subscribe(
            streams.SANDBOXES.subjects[0], stream=self._stream, ordered_consumer=True,
            config=start, idle_heartbeat=5.0,
        )  # fmt: skip
        try:
            while True:
                msg = await sub.next_msg(timeout=None)
                seq = msg.metadata.sequence.stream
                try:
                    envelope = await self._codec.decode(
                        msg.data, tenant=subject_tenant(msg.subject)
                    )
                except CodecError:
                    log.exception("skipped an event it cannot read", extra={"seq": seq})
                else:
                    self._fold(envelope.tenant, envelope.data, seq)
                self._heads[msg.subject] = Head(seq, (msg.headers or {}).get(HASH_HEADER, ""))
                async with self._moved:
                    self.seq = seq
                    self._moved.notify_all()
        finally:
            await sub.unsubscribe()

    def _fold(self, tenant: str, event: Event, seq: int) -> None:
        views = self._tenants.setdefault(tenant, {})
        domain.evolve(views, tenant, event, seq)
        for sandbox in [s for s, v in views.items() if v.status == "deleted"]:
            del views[sandbox]  # nothing later can bring it back: keep the view small
            self._heads.pop(sb.sandbox_subject(tenant, sandbox), None)

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
