"""An event store on JetStream, keeping the guarantees trusted event stores keep.

- Optimistic concurrency per subject (`Nats-Expected-Last-Subject-Sequence`) and dedup by
  event id (`Nats-Msg-Id`), with the lost-ack read-back (`append`, `readback`).
- Atomic multi-event appends (server >= 2.12 batch headers): all stored, contiguous, or none.
- A hash chain per subject over the exact stored bytes, in headers (`fleet_events.chain`).
- Replay of a subject or a wildcard (stream order) from a sequence, live subscription
  (`reads`); snapshot + tail loading, ignoring snapshots of another fold version
  (`snapshots`); verification and verbatim export (`audit`).
- Waiting for the next events of given types after a sequence, with no gap (`watch`).

`EventStore` is all of them over one connection. The rules that need no server (headers and
chain links, the read-back comparison, snapshot keys and validity, export lines) are pure
functions in `headers`, `readback` and `records`.
"""

from nats.js import JetStreamContext

from fleet_events import streams
from fleet_events.codec import Codec
from fleet_events.signing import Signer
from fleet_events.streams import StreamSpec
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.keyfiles import signer_from_env
from fleet_mesh.store.append import MAX_BATCH, Appender
from fleet_mesh.store.audit import Auditor
from fleet_mesh.store.errors import (
    AppendConflict,
    DuplicateElsewhere,
    DuplicateInBatch,
    StoreError,
    StoreUnavailable,
    WrongSubject,
)
from fleet_mesh.store.model import (
    EMPTY,
    Appended,
    Fold,
    Head,
    Loaded,
    RawEvent,
    StoredEvent,
    Verification,
)
from fleet_mesh.store.readback import BATCH_DUPLICATE_ID, WRONG_LAST_SEQUENCE
from fleet_mesh.store.reads import READ_BATCH
from fleet_mesh.store.records import verify_export
from fleet_mesh.store.snapshots import Snapshots
from fleet_mesh.store.watch import Watch, Watches

__all__ = [
    "BATCH_DUPLICATE_ID",
    "EMPTY",
    "MAX_BATCH",
    "READ_BATCH",
    "WRONG_LAST_SEQUENCE",
    "AppendConflict",
    "Appended",
    "DuplicateElsewhere",
    "DuplicateInBatch",
    "EventStore",
    "Fold",
    "Head",
    "Loaded",
    "RawEvent",
    "StoreError",
    "StoreUnavailable",
    "StoredEvent",
    "Verification",
    "Watch",
    "WrongSubject",
    "open_store",
    "verify_export",
]


class EventStore(Appender, Snapshots, Auditor, Watches):
    """Appends, reads, watches, snapshots and audits of one stream, over one connection."""


async def open_store(
    js: JetStreamContext,
    stream: StreamSpec,
    *,
    inline_limit: int | None = None,
    timeout: float = 5.0,
    signer: Signer | None = None,
) -> EventStore:
    """The store as services use it: blobs offloaded to the object store, snapshots in KV, and
    appends signed with the process's key (`signer`, else the file `FLEET_SIGNING_KEY` names;
    neither: unsigned), so every service signs with no change of its own."""
    blobs = await JetStreamBlobs.open(js)
    codec = Codec(blobs) if inline_limit is None else Codec(blobs, inline_limit=inline_limit)
    snapshots = await js.key_value(streams.SNAPSHOTS.bucket)
    signer = signer if signer is not None else signer_from_env()
    return EventStore(js, stream, codec, snapshots=snapshots, timeout=timeout, signer=signer)
