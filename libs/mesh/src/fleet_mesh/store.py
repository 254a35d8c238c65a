"""An event store on JetStream, keeping the guarantees trusted event stores keep.

- Optimistic concurrency per subject (`Nats-Expected-Last-Subject-Sequence`) and dedup by
  event id (`Nats-Msg-Id`). The server checks the sequence *before* dedup, so a retry after a
  lost ack comes back as "wrong last sequence": the store reads the subject's last message and,
  if it carries our event id, reports the append as a duplicate instead of a conflict.
- Atomic multi-event appends (server >= 2.12 batch headers): all stored, contiguous, or none.
- A hash chain per subject over the exact stored bytes, in headers (`fleet_events.chain`).
- Replay of a subject or a wildcard (stream order) from a sequence; snapshot + tail loading,
  ignoring snapshots written by another fold version; live subscription; verification.
"""

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, RawStreamMsg
from nats.js.errors import APIError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from fleet_events import Envelope, streams
from fleet_events.binding import binding_problem, subject_tenant
from fleet_events.catalog import type_of
from fleet_events.chain import (
    GENESIS,
    HASH_HEADER,
    PREV_HEADER,
    TYPE_HEADER,
    ChainFault,
    ChainVerifier,
    link,
)
from fleet_events.codec import Codec
from fleet_events.envelope import Offloaded
from fleet_events.streams import StreamSpec
from fleet_mesh.blobs import JetStreamBlobs

log = logging.getLogger("fleet.store")

S = TypeVar("S")

WRONG_LAST_SEQUENCE = 10071
BATCH_DUPLICATE_ID = 10201
MAX_BATCH = 1000
READ_BATCH = 1000
_NO_LIMIT = 2**63 - 1


class StoreError(Exception):
    """Root of the event store's errors."""


class AppendConflict(StoreError):
    """Someone else appended to the subject first: reload, decide again, retry."""

    def __init__(
        self, subject: str, expected: int, detail: str, *, actual: int | None = None
    ) -> None:
        super().__init__(f"append to {subject} expected last sequence {expected}: {detail}")
        self.subject = subject
        self.expected = expected
        self.actual = actual  # the subject's last sequence when the conflict was read back


class DuplicateElsewhere(StoreError):
    """An event id already stored on another subject: ids are unique across a stream."""


class DuplicateInBatch(AppendConflict):
    """A batch holds an id the stream already has, and the subject did not move: reloading
    will not help. Append its events one at a time to find the one that is not new."""


class WrongSubject(StoreError, ValueError):
    """The envelope names a tenant, session or run other than the subject it is appended to."""


class StoreUnavailable(StoreError):
    """The server did not answer in time; the operation may or may not have happened."""


@dataclass(frozen=True, slots=True)
class Head:
    """The last event of one subject: its stream sequence (0 = none yet) and chain hash."""

    seq: int
    hash: str


EMPTY = Head(0, GENESIS)


@dataclass(frozen=True, slots=True)
class Appended:
    seq: int
    hash: str
    duplicate: bool = False

    @property
    def head(self) -> Head:
        return Head(self.seq, self.hash)


@dataclass(frozen=True, slots=True)
class RawEvent:
    """A stored message as the server holds it: the bytes the chain covers, undecoded."""

    subject: str
    seq: int
    headers: dict[str, str]
    data: bytes


@dataclass(frozen=True, slots=True)
class StoredEvent:
    subject: str
    seq: int
    envelope: Envelope[Any]
    hash: str
    prev_hash: str


class Fold(Protocol[S]):
    """A left fold over stored events. Bump `version` whenever `evolve` changes meaning."""

    name: str
    version: int
    state_type: type[S]

    def initial(self) -> S: ...

    def evolve(self, state: S, event: StoredEvent) -> S: ...


@dataclass(slots=True)
class Loaded(Generic[S]):
    state: S
    seq: int = 0  # stream sequence of the last event folded in
    heads: dict[str, Head] = field(default_factory=dict)
    replayed: int = 0  # events folded by this load (tail only, after a snapshot)
    from_snapshot: bool = False

    def head(self, subject: str) -> Head:
        return self.heads.get(subject, EMPTY)


class _Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    fold: str
    version: int
    seq: int
    heads: dict[str, tuple[int, str]]
    state: msgspec.Raw


@dataclass(frozen=True, slots=True)
class Verification:
    checked: int
    fault: ChainFault | None

    @property
    def ok(self) -> bool:
        return self.fault is None


def _headers(msg: Msg | RawStreamMsg) -> dict[str, str]:
    return dict(msg.headers or {})


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _snapshot_key(fold: str, filter_subject: str) -> str:
    # '=' is allowed in KV keys and never in an id, so a wildcard cannot collide with an id.
    return f"{fold}.{filter_subject.replace('>', '=all').replace('*', '=any')}"


def _check_appendable(subject: str, envelope: Envelope[Any]) -> None:
    if isinstance(envelope.data, Offloaded):
        raise WrongSubject(
            f"event {envelope.id} is an Offloaded stub: only the codec writes those; append the "
            "full event and the store offloads it when it is large"
        )
    problem = binding_problem(subject, envelope)
    if problem is not None:
        raise WrongSubject(problem)


class EventStore:
    def __init__(
        self,
        js: JetStreamContext,
        stream: StreamSpec,
        codec: Codec,
        *,
        nc: Client | None = None,
        snapshots: KeyValue | None = None,
        timeout: float = 5.0,
    ) -> None:
        self._js = js
        self._nc: Client = nc if nc is not None else js._nc
        self._stream = stream.name
        self._codec = codec
        self._snapshots = snapshots
        self._timeout = timeout
        self._encoder = msgspec.msgpack.Encoder()
        self._direct_get = f"$JS.API.DIRECT.GET.{stream.name}"

    # -- writing -----------------------------------------------------------------------------

    async def append(
        self, subject: str, envelope: Envelope[Any], *, expect: Head | None = None
    ) -> Appended:
        """Append one event after `expect` (default: the subject's current head)."""
        _check_appendable(subject, envelope)
        if expect is None:
            expect = await self.head(subject)
        payload = await self._codec.encode(envelope)
        digest = link(expect.hash, payload)
        headers = {
            "Nats-Msg-Id": envelope.id,
            "Nats-Expected-Last-Subject-Sequence": str(expect.seq),
            PREV_HEADER: expect.hash,
            HASH_HEADER: digest,
            TYPE_HEADER: type_of(envelope.data),
        }
        for attempt in range(3):
            try:
                ack = await self._js.publish(
                    subject, payload, timeout=self._timeout, stream=self._stream, headers=headers
                )
            except NatsTimeout:
                # The ack may be lost while the write landed: publishing the same bytes again is
                # safe (dedup by id, and the sequence check + read-back below).
                log.warning("append ack timed out", extra={"subject": subject, "try": attempt})
                headers = dict(headers)
                continue
            except APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    (appended,) = await self._read_back(subject, [envelope.id], expect, exc)
                    return appended
                raise
            if ack.duplicate:
                return await self._duplicate_at(ack.seq, subject, envelope.id)
            return Appended(ack.seq, digest)
        raise StoreError(f"append to {subject}: no acknowledgement after 3 tries")

    async def append_batch(
        self, subject: str, envelopes: Sequence[Envelope[Any]], *, expect: Head | None = None
    ) -> list[Appended]:
        """Append several events atomically and contiguously: all of them or none."""
        if not envelopes:
            return []
        if len(envelopes) == 1:
            return [await self.append(subject, envelopes[0], expect=expect)]
        if len(envelopes) > MAX_BATCH:
            raise ValueError(f"a batch holds at most {MAX_BATCH} events, got {len(envelopes)}")
        for envelope in envelopes:
            _check_appendable(subject, envelope)
        if expect is None:
            expect = await self.head(subject)
        batch_id = envelopes[0].id
        prev = expect.hash
        messages: list[tuple[bytes, dict[str, str], str]] = []
        for index, envelope in enumerate(envelopes, 1):
            payload = await self._codec.encode(envelope)
            digest = link(prev, payload)
            headers = {
                "Nats-Batch-Id": batch_id,
                "Nats-Batch-Sequence": str(index),
                "Nats-Msg-Id": envelope.id,
                PREV_HEADER: prev,
                HASH_HEADER: digest,
                TYPE_HEADER: type_of(envelope.data),
            }
            if index == 1:
                headers["Nats-Expected-Last-Subject-Sequence"] = str(expect.seq)
            messages.append((payload, headers, digest))
            prev = digest
        messages[-1][1]["Nats-Batch-Commit"] = "1"
        for payload, headers, _ in messages[:-1]:
            await self._nc.publish(subject, payload, headers=headers)
        payload, headers, _ = messages[-1]
        try:
            reply = await self._nc.request(subject, payload, headers=headers, timeout=self._timeout)
        except NatsTimeout as exc:
            # Retrying the same call is safe: the read-back recognises a batch that landed.
            raise StoreUnavailable(f"batch append to {subject}: no answer in time") from exc
        answer = json.loads(reply.data)
        error = answer.get("error")
        ids = [e.id for e in envelopes]
        if error:
            if error.get("err_code") in (WRONG_LAST_SEQUENCE, BATCH_DUPLICATE_ID):
                refusal = APIError(
                    err_code=error.get("err_code"), description=error.get("description")
                )
                return await self._read_back(subject, ids, expect, refusal)
            raise StoreError(f"batch append to {subject} refused: {error.get('description')}")
        last_seq = int(answer["seq"])
        first = last_seq - len(envelopes) + 1
        return [Appended(first + i, m[2]) for i, m in enumerate(messages)]

    async def _read_back(
        self, subject: str, ids: list[str], expect: Head, exc: APIError
    ) -> list[Appended]:
        """The append was refused: did an earlier try of it land (its ack lost)?

        The server could only have stored our events right after `expect`, so the subject's
        first events after `expect.seq` are read (one round trip) and every id is compared, in
        order: another writer appending after ours, or storing just one of our ids (a retried
        request), cannot make this answer wrong.
        """
        stored = await self._direct_batch(subject, expect.seq + 1, limit=len(ids))
        found = [raw.headers.get("Nats-Msg-Id") for raw in stored[0]]
        if found == ids:
            return [
                Appended(raw.seq, raw.headers.get(HASH_HEADER, ""), duplicate=True)
                for raw in stored[0]
            ]
        head = await self.head(subject)
        detail = exc.description or "wrong last sequence"
        if exc.err_code == BATCH_DUPLICATE_ID and head.seq == expect.seq:
            raise DuplicateInBatch(subject, expect.seq, detail, actual=head.seq)
        raise AppendConflict(subject, expect.seq, detail, actual=head.seq)

    async def _duplicate_at(self, seq: int, subject: str, event_id: str) -> Appended:
        msg = await self._js.get_msg(self._stream, seq, direct=True)
        if msg.subject != subject:
            raise DuplicateElsewhere(
                f"event id {event_id} is already stored at sequence {seq} on {msg.subject}, "
                f"not on {subject}: event ids must be unique across the {self._stream} stream"
            )
        return Appended(seq, _headers(msg).get(HASH_HEADER, ""), duplicate=True)

    # -- reading -----------------------------------------------------------------------------

    async def _last_raw(self, subject: str) -> RawStreamMsg | None:
        try:
            return await self._js.get_last_msg(self._stream, subject, direct=True)
        except NotFoundError:
            return None

    async def head(self, subject: str) -> Head:
        raw = await self._last_raw(subject)
        if raw is None:
            return EMPTY
        digest = _headers(raw).get(HASH_HEADER)
        if digest is None:
            raise StoreError(
                f"the last message on {subject} (seq {raw.seq}) has no {HASH_HEADER} header: it "
                "was not written through the event store, so nothing can chain after it"
            )
        return Head(raw.seq or 0, digest)

    async def last(self, subject: str) -> StoredEvent | None:
        raw = await self._last_raw(subject)
        if raw is None:
            return None
        return await self._stored(
            raw.subject or subject, raw.seq or 0, _headers(raw), raw.data or b""
        )

    async def _stored(
        self, subject: str, seq: int, headers: dict[str, str], data: bytes
    ) -> StoredEvent:
        return StoredEvent(
            subject=subject,
            seq=seq,
            envelope=await self._codec.decode(data, tenant=subject_tenant(subject)),
            hash=headers.get(HASH_HEADER, ""),
            prev_hash=headers.get(PREV_HEADER, ""),
        )

    async def tail(self, subject: str, *, after_seq: int) -> AsyncIterator[StoredEvent]:
        """Everything after `after_seq`, with no head lookup first: a short tail (a writer
        catching up after a lost race) costs exactly one round trip."""
        async for raw in self.read_raw(subject, from_seq=after_seq + 1, up_to_seq=_NO_LIMIT):
            yield await self._stored(raw.subject, raw.seq, raw.headers, raw.data)

    async def read_raw(
        self, filter_subject: str, *, from_seq: int = 1, up_to_seq: int | None = None
    ) -> AsyncIterator[RawEvent]:
        """Stored messages in stream order, up to the head at call time (or `up_to_seq`).

        Batched direct gets (server >= 2.11): the server streams up to `READ_BATCH` matching
        messages per request, with no consumer to create or delete, so a short tail costs one
        round trip and a long replay a few. Streams are created with `allow_direct`.
        """
        if up_to_seq is None:
            last = await self._last_raw(filter_subject)
            up_to_seq = (last.seq or 0) if last is not None else 0
        seq = from_seq
        while seq <= up_to_seq:
            batch, more = await self._direct_batch(filter_subject, seq)
            for raw in batch:
                if raw.seq > up_to_seq:
                    return
                yield raw
            if not more or not batch:
                return
            seq = batch[-1].seq + 1

    async def _direct_batch(
        self, filter_subject: str, seq: int, *, limit: int = READ_BATCH
    ) -> tuple[list[RawEvent], bool]:
        """One batched direct get: the messages, and whether more match after them."""
        messages: list[Msg] = []
        finished: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

        async def collect(msg: Msg) -> None:  # a callback: far cheaper than next_msg per message
            if msg.headers and "Status" in msg.headers:
                if not finished.done():
                    finished.set_result(msg)
            else:
                messages.append(msg)

        request = {"seq": seq, "next_by_subj": filter_subject, "batch": limit}
        sub = await self._nc.subscribe(
            self._nc.new_inbox(), cb=collect, pending_msgs_limit=READ_BATCH * 2
        )
        try:
            await self._nc.publish(self._direct_get, _json_bytes(request), sub.subject)
            end = await asyncio.wait_for(finished, self._timeout)
        except TimeoutError as exc:
            raise StoreUnavailable(
                f"reading {filter_subject} from {seq}: no answer in time"
            ) from exc
        finally:
            await sub.unsubscribe()
        status = (end.headers or {}).get("Status")
        if status not in ("204", "404"):
            raise StoreError(
                f"reading {filter_subject} from {seq}: server answered {status} "
                f"{(end.headers or {}).get('Description', '')}"
            )
        batch = []
        for msg in messages:
            headers = _headers(msg)
            batch.append(
                RawEvent(headers["Nats-Subject"], int(headers["Nats-Sequence"]), headers, msg.data)
            )
        more = status == "204" and int((end.headers or {}).get("Nats-Num-Pending", "0")) > 0
        return batch, more

    async def replay(self, filter_subject: str, *, from_seq: int = 1) -> AsyncIterator[StoredEvent]:
        """Events of a subject or wildcard, in stream order, up to the head at call time."""
        async for raw in self.read_raw(filter_subject, from_seq=from_seq):
            yield await self._stored(raw.subject, raw.seq, raw.headers, raw.data)

    async def subscribe(
        self, filter_subject: str, *, from_seq: int = 1
    ) -> AsyncIterator[StoredEvent]:
        """Live: everything from `from_seq`, then each new event as it lands. Never ends.

        An ordered consumer: the server pushes new events as they are stored, and the client
        library recreates the consumer from the last sequence seen if a message goes missing.
        """
        sub = await self._js.subscribe(
            filter_subject,
            stream=self._stream,
            ordered_consumer=True,
            config=_start_at(max(1, from_seq)),
            idle_heartbeat=5.0,
        )
        try:
            while True:
                msg = await sub.next_msg(timeout=None)
                yield await self._stored(
                    msg.subject, msg.metadata.sequence.stream, _headers(msg), msg.data
                )
        finally:
            await sub.unsubscribe()

    # -- folding -----------------------------------------------------------------------------

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
            loaded = await self._read_snapshot(filter_subject, fold) or Loaded(fold.initial())
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

    async def _read_snapshot(self, filter_subject: str, fold: Fold[S]) -> Loaded[S] | None:
        assert self._snapshots is not None
        try:
            entry = await self._snapshots.get(_snapshot_key(fold.name, filter_subject))
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        snap = msgspec.msgpack.decode(entry.value, type=_Snapshot)
        if snap.fold != fold.name or snap.version != fold.version:
            log.info(
                "ignoring snapshot of another fold version",
                extra={"fold": fold.name, "stored": snap.version, "current": fold.version},
            )
            return None
        last = await self._last_raw(filter_subject)
        if last is None or (last.seq or 0) < snap.seq:
            # The log no longer reaches the snapshot (purged): the snapshot must not outlive it.
            log.warning("ignoring snapshot beyond the log", extra={"filter": filter_subject})
            return None
        state = msgspec.msgpack.decode(snap.state, type=fold.state_type)
        heads = {subject: Head(seq, digest) for subject, (seq, digest) in snap.heads.items()}
        return Loaded(state, seq=snap.seq, heads=heads, from_snapshot=True)

    async def save_snapshot(self, filter_subject: str, fold: Fold[S], loaded: Loaded[S]) -> None:
        if self._snapshots is None:
            raise StoreError("this store was built without a snapshot bucket")
        snap = _Snapshot(
            fold=fold.name,
            version=fold.version,
            seq=loaded.seq,
            heads={subject: (h.seq, h.hash) for subject, h in loaded.heads.items()},
            state=msgspec.Raw(self._encoder.encode(loaded.state)),
        )
        await self._snapshots.put(
            _snapshot_key(fold.name, filter_subject), self._encoder.encode(snap)
        )

    # -- auditing ----------------------------------------------------------------------------

    async def verify(self, filter_subject: str, *, from_seq: int = 1) -> Verification:
        """Check every chain under `filter_subject`; name the first bad event."""
        verifier = ChainVerifier(trust_first=from_seq > 1)
        async for raw in self.read_raw(filter_subject, from_seq=from_seq):
            fault = verifier.feed(
                raw.subject,
                raw.seq,
                raw.headers.get("Nats-Msg-Id", "?"),
                raw.headers.get(PREV_HEADER),
                raw.headers.get(HASH_HEADER),
                raw.data,
            )
            if fault is not None:
                break
        return Verification(verifier.checked, verifier.fault)

    async def export(self, filter_subject: str) -> AsyncIterator[bytes]:
        """JSON lines carrying the verbatim stored bytes beside their chain hashes."""
        async for raw in self.read_raw(filter_subject):
            yield json.dumps(
                {
                    "subject": raw.subject,
                    "seq": raw.seq,
                    "id": raw.headers.get("Nats-Msg-Id"),
                    "prev": raw.headers.get(PREV_HEADER),
                    "hash": raw.headers.get(HASH_HEADER),
                    "payload": base64.b64encode(raw.data).decode(),
                },
                separators=(",", ":"),
            ).encode()


def verify_export(lines: Iterable[bytes]) -> Verification:
    """Verify an export on its own, with no server: the same chain rule over the same bytes."""
    verifier = ChainVerifier()
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            payload = base64.b64decode(row["payload"], validate=True)
            subject, seq, event_id = str(row["subject"]), int(row["seq"]), str(row["id"])
            prev, claimed = row.get("prev"), row.get("hash")
        except (ValueError, KeyError, TypeError) as exc:
            fault = ChainFault("?", -1, "?", f"export line {number} is unreadable: {exc!r}")
            return Verification(verifier.checked, fault)
        if verifier.feed(subject, seq, event_id, prev, claimed, payload):
            break
    return Verification(verifier.checked, verifier.fault)


def _start_at(seq: int) -> ConsumerConfig:
    return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seq)


async def open_store(
    js: JetStreamContext,
    stream: StreamSpec,
    *,
    inline_limit: int | None = None,
    timeout: float = 5.0,
) -> EventStore:
    """The store as services use it: blobs offloaded to the object store, snapshots in KV."""
    blobs = await JetStreamBlobs.open(js)
    codec = Codec(blobs) if inline_limit is None else Codec(blobs, inline_limit=inline_limit)
    snapshots = await js.key_value(streams.SNAPSHOTS.bucket)
    return EventStore(js, stream, codec, snapshots=snapshots, timeout=timeout)
