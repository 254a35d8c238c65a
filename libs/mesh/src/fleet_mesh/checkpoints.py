"""The checkpointer: signed checkpoints of a stream's chain heads, by a key no service holds.

It reads the stream from where its last checkpoint stopped, checks every new event (chain and
signature, against the pinned key set) and, each period, appends one `Checkpoint` naming the
heads that moved, chained to the one before and signed with the checkpoint key, to a file
under the data dir that only this process writes. A rewrite before a checkpoint (a purge and
a re-signed chain, by a holder of a service key) no longer holds the pinned sequences and
hashes, so the verifier names it. An admin purge goes through `purge` (one subject) or
`purge_session` (every subject of a deleted session, served to the gateway as
`fleet_events.bus.PURGE_SESSION` by `serve_purges`): a receipt in a signed checkpoint
first, then the purge, so the removed events stay accounted for.

Run as its own process (`python -m fleet_mesh.checkpoints`, on `fleet_mesh.service.run`: it
stops on SIGTERM or SIGINT), the only one given the key; `fleet up` runs the same setup in its
own process (`fleet_cli.keys.checkpointing`, on `service.running`).
"""

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.client import Client
from nats.js import JetStreamContext
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_events import bus, streams, utc_now
from fleet_events.chain import HASH_HEADER, PREV_HEADER, ChainVerifier
from fleet_events.session import PurgeReceipt, PurgeSession, log_subject, session_filter
from fleet_events.signing import (
    CHECKPOINT,
    GENESIS_CHECKPOINT,
    KEY_HEADER,
    SIG_HEADER,
    Checkpoint,
    KeySet,
    Signer,
    SigningError,
    checkpoint_chain_problem,
)
from fleet_events.streams import StreamSpec
from fleet_mesh import rpc, service
from fleet_mesh.keyfiles import read_keyset, read_signer
from fleet_mesh.service import ServiceContext
from fleet_mesh.settings import BadSetting, read_settings
from fleet_mesh.store import EventStore, open_store
from fleet_mesh.store.headers import MSG_ID

log = logging.getLogger("fleet.checkpoints")

ROLE = bus.PURGE_SESSION.service
"""The process's name on the bus: a role, no service (`fleet_events.subjects.ROLES`)."""

CHECKPOINT_KEY_ENV = "FLEET_CHECKPOINT_KEY"
KEYSET_ENV = "FLEET_KEYSET"
CHECKPOINT_DIR_ENV = "FLEET_CHECKPOINT_DIR"
INTERVAL_ENV = "FLEET_CHECKPOINT_INTERVAL_S"


def checkpoint_file(directory: Path, stream: str) -> Path:
    return directory / f"{stream}.checkpoints.jsonl"


def read_checkpoints(path: Path) -> list[Checkpoint]:
    if not path.exists():
        return []
    return [Checkpoint.parse(line) for line in path.read_bytes().splitlines() if line.strip()]


PURGE_ROUNDS = 5
"""A session purge takes another receipt for events appended while it ran, this many times at
most (each round's receipt names exactly what that round purged)."""


class PurgeRefused(Exception):
    """A purge the checkpointer declines (the session is not tombstoned), with why."""


class Checkpointer:
    def __init__(
        self,
        store: EventStore,
        stream: StreamSpec,
        signer: Signer,
        keys: KeySet,
        path: Path,
        *,
        js: JetStreamContext,
    ) -> None:
        if signer.role != CHECKPOINT or signer.key_id not in keys.keys:
            raise SigningError(
                f"the checkpointer needs a checkpoint key in the pinned key set; "
                f"{signer.owner}'s key {signer.key_id} is a {signer.role} key"
                + ("" if signer.key_id in keys.keys else " not in the key set")
            )
        self._store, self._stream, self._signer, self._keys = store, stream.name, signer, keys
        self._path, self._js = path, js
        self._filter = stream.subjects[0] if len(stream.subjects) == 1 else ">"
        written = read_checkpoints(path)
        problem = checkpoint_chain_problem(written, keys)
        if problem is not None:  # never extend a chain it cannot vouch for
            raise SigningError(f"{path}: {problem}; move the file aside and start a new chain")
        self._number = written[-1].number if written else 0
        self._prev = written[-1].digest() if written else GENESIS_CHECKPOINT
        self._upto = written[-1].upto if written else 0
        self._heads: dict[str, str] = {}
        for cp in written:
            for subject in cp.purged:
                self._heads.pop(subject, None)
            self._heads.update({s: h for s, (_, h) in cp.heads.items()})
        self._refused: set[str] = set()
        self._lock = asyncio.Lock()  # a purge and the periodic checkpoint never interleave

    @property
    def number(self) -> int:
        return self._number

    def _write(
        self, heads: dict[str, tuple[int, str]], purged: dict[str, tuple[int, str]]
    ) -> Checkpoint:
        cp = Checkpoint(
            self._number + 1, self._prev, self._stream, utc_now().isoformat(), self._upto,
            heads, purged,
        ).signed(self._signer)  # fmt: skip
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, cp.line() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        self._number, self._prev = cp.number, cp.digest()
        return cp

    async def checkpoint(self) -> Checkpoint | None:
        """Read what landed since the last checkpoint; sign the heads that moved (None: none
        did). An event that fails its chain or signature is logged and never checkpointed, and
        its subject is left out from then on: the checkpointer vouches only for what verifies."""
        async with self._lock:
            return await self._checkpoint()

    async def _checkpoint(self) -> Checkpoint | None:
        verifier = ChainVerifier(trust_first=False, keys=self._keys, heads=dict(self._heads))
        verifier.last_seq = self._upto
        moved: dict[str, tuple[int, str]] = {}
        async for raw in self._store.read_raw(self._filter, from_seq=self._upto + 1):
            self._upto = raw.seq
            if raw.subject in self._refused:
                continue
            fault = verifier.feed(
                raw.subject, raw.seq, raw.headers.get(MSG_ID, "?"),
                raw.headers.get(PREV_HEADER), raw.headers.get(HASH_HEADER), raw.data,
                raw.headers.get(KEY_HEADER), raw.headers.get(SIG_HEADER),
            )  # fmt: skip
            if fault is not None:
                log.error("not checkpointing %s: %s", raw.subject, fault)
                self._refused.add(raw.subject)
                verifier.fault = None
                continue
            moved[raw.subject] = (raw.seq, raw.headers[HASH_HEADER])
        if not moved:
            return None
        self._heads.update({s: h for s, (_, h) in moved.items()})
        return self._write(moved, {})

    async def purge(self, subject: str) -> Checkpoint:
        """An admin purge that stays verifiable: checkpoint what is there, sign a receipt for
        the subject's head, then purge. The subject's next event starts a new chain."""
        async with self._lock:
            return await self._purge(subject)

    async def _purge(self, subject: str) -> Checkpoint:
        await self._checkpoint()
        head = await self._store.head(subject)
        receipt = self._write({}, {subject: (head.seq, head.hash)})
        await self._purge_upto(subject, head.seq)
        return receipt

    async def _purge_upto(self, subject: str, seq: int) -> None:
        """Purge `subject` up to and including `seq`, the head its receipt names, and nothing
        after: an event appended between the receipt and the purge is never purged unreceipted
        (it stays, and chains from a head the log no longer holds, which verification names)."""
        if seq > 0:
            await self._js.purge_stream(self._stream, subject=subject, seq=seq + 1)
        self._heads.pop(subject, None)
        self._refused.discard(subject)

    async def purge_session(self, tenant: str, session: str) -> Checkpoint:
        """Every subject of a tombstoned session (its log and its runs) purged behind one
        receipt. Refused (`PurgeRefused`) unless the log's last event is `session.deleted`:
        whoever can reach this on the bus can only purge what its owner already deleted."""
        async with self._lock:
            return await self._purge_session(tenant, session)

    async def _purge_session(self, tenant: str, session: str) -> Checkpoint:
        log_ = log_subject(tenant, session)
        last = await self._store.last(log_)
        kind = None if last is None else last.envelope.data.__struct_config__.tag
        if kind != "session.deleted":
            raise PurgeRefused(
                f"session {session!r} of tenant {tenant!r} is "
                + ("not there" if last is None else f"not deleted (its log ends with {kind})")
                + ": only a deleted session is purged; delete it first"
            )
        await self._checkpoint()
        where = session_filter(tenant, session)
        first: Checkpoint | None = None
        for round_ in range(PURGE_ROUNDS + 1):
            info = await self._js.stream_info(self._stream, subjects_filter=where)
            subjects = sorted((info.state.subjects or {}).keys())
            if not subjects:
                break
            if round_ == PURGE_ROUNDS:  # looked once more after the last round: still there
                log.warning(
                    "session %s of %s still has events after %d purge rounds (something keeps "
                    "appending to it); each purged event has its receipt", session, tenant,
                    PURGE_ROUNDS,
                )  # fmt: skip
                break
            heads = {s: await self._store.head(s) for s in subjects}
            receipt = self._write({}, {s: (h.seq, h.hash) for s, h in heads.items()})
            first = first or receipt
            for subject, head in heads.items():
                await self._purge_upto(subject, head.seq)
        if first is None:  # the log held session.deleted a moment ago, under our lock
            raise PurgeRefused(f"session {session!r} of tenant {tenant!r} vanished mid-purge")
        return first

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.checkpoint()
            except Exception:  # a server that is away now answers later; the file is whole
                log.warning("checkpoint failed", exc_info=True)
            with contextlib.suppress(TimeoutError):  # the period passed with no stop asked
                await asyncio.wait_for(stop.wait(), interval_s)


async def serve_purges(nc: Client, checkpointer: Checkpointer) -> rpc.Served:
    """Answer `fleet_events.bus.PURGE_SESSION` (the gateway asks it for an admin) from the
    one process that holds the checkpoint key. A session that is not deleted is refused
    with `bad_request` naming why; nothing is purged then."""

    async def purge(request: PurgeSession) -> PurgeReceipt:
        try:
            receipt = await checkpointer.purge_session(request.tenant, request.session)
        except PurgeRefused as exc:
            raise rpc.BadRequest(str(exc)) from None
        log.info(
            "purged session %s of %s for %s (receipt %d)", request.session, request.tenant,
            request.by, receipt.number,
        )  # fmt: skip
        return PurgeReceipt(
            receipt=receipt.number, digest=receipt.digest(),
            purged={s: (seq, h) for s, (seq, h) in receipt.purged.items()},
            key=receipt.key_id,
        )  # fmt: skip

    return await rpc.serve_verb(nc, bus.PURGE_SESSION, purge, concurrency=1)


class CheckpointerSettings(BaseSettings):
    """What the checkpointer process is given, read once at its start: its key, the pinned
    key set, the directory of its checkpoint file, and the period."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_ignore_empty=True)

    key: Path = Field(validation_alias=CHECKPOINT_KEY_ENV)
    keyset: Path = Field(validation_alias=KEYSET_ENV)
    directory: Path = Field(validation_alias=CHECKPOINT_DIR_ENV)
    interval_s: float = Field(default=10.0, gt=0, validation_alias=INTERVAL_ENV)


def checkpointer_setup(
    signer: Signer,
    keys: KeySet,
    directory: Path,
    interval_s: float,
    *,
    started: Callable[[Checkpointer], None] = lambda _: None,
) -> Callable[[ServiceContext], Awaitable[None]]:
    """The checkpointer as a process on `fleet_mesh.service`: on start it vouches for its file
    (a chain it cannot verify stops the start), checkpoints every `interval_s` and serves
    `PURGE_SESSION`; on stop the purges end first, then the loop, at a checkpoint's edge."""

    async def setup(ctx: ServiceContext) -> None:
        store = await open_store(ctx.js, streams.SESSIONS, signer=None)
        path = checkpoint_file(directory, streams.SESSIONS.name)
        checkpointer = Checkpointer(store, streams.SESSIONS, signer, keys, path, js=ctx.js)
        stop = asyncio.Event()
        loop = asyncio.create_task(checkpointer.run(interval_s, stop), name="checkpoints")

        async def halt() -> None:
            stop.set()
            await loop

        ctx.on_stop.append(halt)
        ctx.served.append(await serve_purges(ctx.nc, checkpointer))
        started(checkpointer)

    return setup


def main() -> None:  # pragma: no cover - the process entry point (tests run `checkpointer_setup`)
    """`python -m fleet_mesh.checkpoints`: the checkpointer alone, stopped by SIGTERM/SIGINT.
    A bad setting or a key that cannot be read ends it before it connects, with one line."""
    try:
        settings = read_settings(CheckpointerSettings)
        signer = read_signer(settings.key)
        keys = read_keyset(settings.keyset)
        settings.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (BadSetting, SigningError, OSError) as exc:
        sys.exit(f"{ROLE}: {exc}")
    service.run(ROLE, checkpointer_setup(signer, keys, settings.directory, settings.interval_s))


if __name__ == "__main__":  # pragma: no cover
    main()
