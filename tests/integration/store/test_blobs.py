"""Large payloads go through the object store, scoped by tenant."""

import pytest
from nats.js import JetStreamContext

from fleet_events import new_id, streams
from fleet_events.codec import INLINE_LIMIT
from fleet_events.envelope import Offloaded
from fleet_events.session import TurnRequested, log_subject
from fleet_mesh.blobs import BlobNotFound, BlobUnavailable, InvalidDigest, JetStreamBlobs
from fleet_mesh.store import EMPTY, EventStore

from .conftest import envelope


async def test_a_payload_over_the_inline_limit_round_trips_through_the_object_store(
    store: EventStore, js: JetStreamContext
) -> None:
    subject = log_subject("acme", new_id())
    message = "x" * (INLINE_LIMIT + 10_000)
    await store.append(subject, envelope(TurnRequested(message=message), subject), expect=EMPTY)

    raw = await js.get_last_msg(streams.SESSIONS.name, subject, direct=True)
    assert raw.data is not None
    assert len(raw.data) < 1024  # the log keeps a stub
    replayed = [e async for e in store.replay(subject)]
    assert replayed[0].envelope.data == TurnRequested(message=message)
    assert (await store.verify(subject)).ok
    stub = store._codec.decode_stored(raw.data)  # what is stored names the blob
    assert isinstance(stub.data, Offloaded)
    assert stub.data.blob.object == f"acme/{stub.data.blob.sha256}"
    assert stub.data.of_type == "turn.requested"


async def test_a_tenant_scoped_read_never_reaches_another_tenants_blob(
    js: JetStreamContext,
) -> None:
    blobs = await JetStreamBlobs.open(js)
    ref = await blobs.put("tenant-a", b"secret plans of tenant a")

    assert await blobs.get("tenant-a", ref.sha256) == b"secret plans of tenant a"
    with pytest.raises(BlobNotFound):
        await blobs.get("tenant-b", ref.sha256)
    for forged in ("../tenant-a/" + ref.sha256, "tenant-a/" + ref.sha256, ref.sha256.upper(), ""):
        with pytest.raises(InvalidDigest, match="expected 64 lowercase hex digits"):
            await blobs.get("tenant-b", forged)


async def test_putting_the_same_blob_twice_stores_it_once(js: JetStreamContext) -> None:
    blobs = await JetStreamBlobs.open(js)
    data = new_id().encode() * 1000
    first = await blobs.put("acme", data)
    second = await blobs.put("acme", data)
    assert first == second
    assert await blobs.get("acme", first.sha256) == data


async def test_a_read_whose_chunks_vanish_under_it_fails_in_time_instead_of_waiting_forever(
    js: JetStreamContext,
) -> None:
    """What a writer replacing the chunks mid-read leaves a reader: info naming chunks that are
    gone. nats-py's get waits for them with no bound (this test hung until pytest's timeout);
    ours gives up after its bound, twice, and says so."""
    store = await js.object_store(streams.BLOBS.bucket)
    blobs = JetStreamBlobs(store, get_timeout_s=0.5)
    tenant = new_id()
    ref = await blobs.put(tenant, b"chunks that will vanish" * 100)
    info = await store.get_info(ref.object)
    await js.purge_stream(
        f"OBJ_{streams.BLOBS.bucket}", subject=f"$O.{streams.BLOBS.bucket}.C.{info.nuid}"
    )
    with pytest.raises(BlobUnavailable, match=r"did not arrive within 0\.5s twice"):
        await blobs.get(tenant, ref.sha256)
