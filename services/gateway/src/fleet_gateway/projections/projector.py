"""The projector: folds the SESSIONS stream into this replica's read models, in batches, from
its checkpoint.

It reads with batched direct gets (`EventStore.read_raw`: up to 1,000 messages per round trip,
no consumer to create, nothing on the server to clean up when a replica dies) and commits every
`BATCH` events with the checkpoint. While the log moves it lets the tail gather for
`GATHER_S` between reads (one round trip and one transaction per few events, not per event),
unless a reader is waiting for a sequence (`ProjectionStore.wanted`), which it serves at once.
When a read finds nothing it rings a one-shot doorbell: a core subscription on
`fleet.session.>` that the server ends after one message, registered before a last read so no
append falls between, then waits for it or `IDLE_POLL_S` (a missed doorbell, a reconnect, costs
at most that long). A busy log therefore costs no doorbell message per event: every message a
subscription receives is parsed by nats-py, headers and all, which was a third of the
projector's cost at 1,000 events/s (docs/websocket.md).

Only the event types the read models read are decoded (picked by the `Fleet-Type` header);
an event that cannot be decoded (a newer writer's type, a payload whose blob is gone) is
logged once by type and skipped, never stopping the projection of everything after it.
"""

import asyncio
import contextlib
import logging
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from fleet_events import Envelope
from fleet_events.binding import subject_tenant
from fleet_events.chain import TYPE_HEADER
from fleet_events.codec import Codec, CodecError
from fleet_gateway.projections.store import Folded, ProjectionStore
from fleet_mesh.store import EventStore, RawEvent, StoreError

SESSIONS_FILTER = "fleet.session.>"
BATCH = 500
IDLE_POLL_S = 1.0
GATHER_S = 0.01
"""How long the tail of a moving log gathers between reads (a waiting reader cuts it short)."""
NO_LIMIT = 2**63 - 1

READ_TYPES = frozenset(
    {
        "session.created",
        "session.renamed",
        "session.deleted",
        "session.purged",
        "session.imported",
        "session.restored",
        "turn.requested",
        "turn.started",
        "turn.completed",
        "turn.failed",
        "turn.cancelled",
        "turn.refused",
        "turn.cancel_requested",
        "memory.core_changed",
        "memory.file_written",
        "document.loaded",
        "document.activated",
        "document.removed",
        "session.sandbox_attached",
        "session.sandbox_detached",
        "input.requested",
        "input.provided",
        "input.expired",
        "run.llm_called",
    }
)

log = logging.getLogger("fleet.gateway.projector")


class Projector:
    def __init__(
        self, nc: Client, store: EventStore, codec: Codec, projections: ProjectionStore
    ) -> None:
        self._nc = nc
        self._store = store
        self._codec = codec
        self.projections = projections
        self._skipped: set[str] = set()
        self._stopping = asyncio.Event()
        self.finished = asyncio.Event()

    def stop(self) -> None:
        """Ask `run` to end at its next wait (it finishes the batch it is committing)."""
        self._stopping.set()

    async def _decode(self, raw: RawEvent) -> Envelope[Any] | None:
        kind = raw.headers.get(TYPE_HEADER, "")
        if kind not in READ_TYPES:
            return None
        try:
            return await self._codec.decode(raw.data, tenant=subject_tenant(raw.subject))
        except (CodecError, StoreError, ValueError) as exc:
            if kind not in self._skipped:
                self._skipped.add(kind)
                log.warning(
                    "event skipped by the projector",
                    extra={"type": kind, "seq": raw.seq, "error": type(exc).__name__},
                )
            return None

    async def catch_up(self) -> int:
        """Fold everything stored after the checkpoint; returns how many messages it read."""
        read = 0
        batch: list[Folded] = []
        async for raw in self._store.read_raw(
            SESSIONS_FILTER, from_seq=self.projections.checkpoint + 1, up_to_seq=NO_LIMIT
        ):
            batch.append(Folded(raw.subject, raw.seq, await self._decode(raw)))
            read += 1
            if len(batch) >= BATCH:
                await self.projections.apply_batch(batch)
                batch = []
        if batch:
            await self.projections.apply_batch(batch)
        return read

    async def run(self) -> None:
        """Until `stop`: catch up; while the log moves, let the tail gather; when it is still,
        wait for the doorbell (or the idle poll)."""
        try:
            while not self._stopping.is_set():
                self.projections.wanted.clear()  # a reader waiting from now on cuts the gather
                read = await self._read()
                if read >= BATCH:
                    continue  # far behind: read on
                if read > 0:
                    await _first(self.projections.wanted, self._stopping, GATHER_S)
                    continue
                await self._idle()
        finally:
            self.finished.set()

    async def _idle(self) -> None:
        """Nothing new: ring a one-shot doorbell, read once more (what landed before it was
        registered), and wait for it if that found nothing either."""
        doorbell = asyncio.Event()

        async def ring(_: Msg) -> None:
            doorbell.set()

        try:
            sub = await self._nc.subscribe(SESSIONS_FILTER, cb=ring)
            # the server ends it after one message; nats-py's `subscribe(max_msgs=1)` only
            # drops the rest on arrival, after the server has sent them all
            await sub.unsubscribe(limit=1)
            await self._nc.flush()  # registered before the read below: nothing falls between
        except (NatsError, TimeoutError) as exc:
            log.warning("projector doorbell failed", extra={"error": type(exc).__name__})
            await _first(self._stopping, self._stopping, IDLE_POLL_S)
            return
        try:
            if await self._read() == 0:
                await _first(doorbell, self._stopping, IDLE_POLL_S)
        finally:
            if not doorbell.is_set():
                with contextlib.suppress(Exception):  # a connection already closing
                    await sub.unsubscribe()

    async def _read(self) -> int:
        if not self._nc.is_connected:  # reading now would only fill the reconnect buffer
            return 0
        try:
            return await self.catch_up()
        except (StoreError, TimeoutError, NatsError) as exc:
            log.warning("projector read failed", extra={"error": type(exc).__name__})
            return 0


async def _first(a: asyncio.Event, b: asyncio.Event, timeout: float) -> None:
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
