"""The projector: folds the SESSIONS stream into this replica's read models, in batches, from
its checkpoint.

It reads with batched direct gets (`EventStore.read_raw`: up to 1,000 messages per round trip,
no consumer to create, nothing on the server to clean up when a replica dies), commits every
`BATCH` events with the checkpoint, and when it has caught up waits for the next message on
`fleet.session.>` (a core subscription used only as a doorbell) or `IDLE_POLL_S`, whichever
comes first, so a missed doorbell (a reconnect) costs at most that long.

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
NO_LIMIT = 2**63 - 1

READ_TYPES = frozenset(
    {
        "session.created",
        "session.renamed",
        "session.deleted",
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
        """Until `stop`: catch up, then wait for the doorbell (or the idle poll)."""
        doorbell = asyncio.Event()

        async def ring(_: Msg) -> None:
            doorbell.set()

        sub = await self._nc.subscribe(SESSIONS_FILTER, cb=ring)
        await self._nc.flush()  # registered before the first catch-up: no append falls between
        try:
            while not self._stopping.is_set():
                doorbell.clear()
                read = 0
                if self._nc.is_connected:  # reading now would only fill the reconnect buffer
                    try:
                        read = await self.catch_up()
                    except (StoreError, TimeoutError, NatsError) as exc:
                        log.warning("projector read failed", extra={"error": type(exc).__name__})
                if read == 0:
                    await _first(doorbell, self._stopping, IDLE_POLL_S)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            self.finished.set()


async def _first(a: asyncio.Event, b: asyncio.Event, timeout: float) -> None:
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
