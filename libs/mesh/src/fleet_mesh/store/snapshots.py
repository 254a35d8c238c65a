"""Folding the log: from a snapshot of the same fold version plus the tail, or from the start.

A snapshot only saves work, so one that cannot be trusted (`records.unusable`) is ignored and
one that cannot be saved is logged: the fold's answer never depends on it.
"""

import logging
from typing import TypeVar

import msgspec
from nats.js.errors import KeyNotFoundError

from fleet_mesh.store import records
from fleet_mesh.store.errors import StoreError
from fleet_mesh.store.model import Fold, Head, Loaded
from fleet_mesh.store.reads import Reader

log = logging.getLogger("fleet.store")

S = TypeVar("S")


class Snapshots(Reader):
    async def load(
        self,
        filter_subject: str,
        fold: Fold[S],
        *,
        use_snapshot: bool = True,
        snapshot_after: int | None = None,
    ) -> Loaded[S]:
        """Fold a subject / wildcard: from its snapshot (same fold version) plus the tail.

        With `snapshot_after`, a load that folded more than that many events saves a fresh
        snapshot, so the next load replays less.
        """
        loaded: Loaded[S] = Loaded(fold.initial())
        if use_snapshot and self._snapshots is not None:
            loaded = await self.read_snapshot(filter_subject, fold) or Loaded(fold.initial())
        state = loaded.state
        async for event in self.replay(filter_subject, from_seq=loaded.seq + 1):
            state = fold.evolve(state, event)
            loaded.heads[event.subject] = Head(event.seq, event.hash)
            loaded.seq = event.seq
            loaded.replayed += 1
        loaded.state = state
        if snapshot_after is not None and loaded.replayed > snapshot_after:
            try:
                await self.save_snapshot(filter_subject, fold, loaded)
            except Exception:  # the fold is right; only the next load will be slower
                log.warning("snapshot not saved", exc_info=True, extra={"filter": filter_subject})
        return loaded

    async def read_snapshot(self, filter_subject: str, fold: Fold[S]) -> Loaded[S] | None:
        """The subject's snapshot for this fold version, if one can be trusted; else None."""
        assert self._snapshots is not None
        try:
            entry = await self._snapshots.get(records.snapshot_key(fold.name, filter_subject))
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        snap = msgspec.msgpack.decode(entry.value, type=records.Snapshot)
        last = await self._last_raw(filter_subject)
        why = records.unusable(snap, fold.name, fold.version, (last.seq or 0) if last else 0)
        if why is not None:
            log.info(
                "ignoring snapshot",
                extra={"filter": filter_subject, "fold": fold.name, "why": why,
                       "stored": snap.version, "current": fold.version},
            )  # fmt: skip
            return None
        state = msgspec.msgpack.decode(snap.state, type=fold.state_type)
        return records.loaded_from(snap, state)

    async def save_snapshot(self, filter_subject: str, fold: Fold[S], loaded: Loaded[S]) -> None:
        if self._snapshots is None:
            raise StoreError("this store was built without a snapshot bucket")
        state = self._encoder.encode(loaded.state)
        snap = records.snapshot_of(fold.name, fold.version, loaded, state)
        await self._snapshots.put(
            records.snapshot_key(fold.name, filter_subject), self._encoder.encode(snap)
        )
