"""Codec edges: the inline limit is inclusive, and an offloaded event is read only for the
tenant it is stored under, with errors that say which event and why."""

import msgspec
import pytest

from fleet_events import Actor, BlobRef, Envelope, utc_now
from fleet_events.codec import Codec, CodecError, sha256_hex
from fleet_events.session import TurnRequested


class Blobs:
    def __init__(self) -> None:
        self.items: dict[str, bytes] = {}

    async def put(self, tenant: str, data: bytes) -> BlobRef:
        self.items[f"{tenant}/{sha256_hex(data)}"] = data
        return BlobRef(
            object=f"{tenant}/{sha256_hex(data)}", sha256=sha256_hex(data), size=len(data)
        )

    async def get(self, tenant: str, sha256: str) -> bytes:
        return self.items[f"{tenant}/{sha256}"]


ENVELOPE: Envelope[TurnRequested] = Envelope(
    id="e1",
    tenant="acme",
    session="s1",
    actor=Actor(service="test", replica="0"),
    ts=utc_now(),
    data=TurnRequested(message="x" * 100),
)


async def test_an_envelope_exactly_at_the_inline_limit_stays_inline() -> None:
    size = len(Codec().encode_inline(ENVELOPE))
    assert Codec().encode_inline(ENVELOPE) == msgspec.json.encode(ENVELOPE)
    blobs = Blobs()
    assert await Codec(blobs, inline_limit=size).encode(ENVELOPE) == msgspec.json.encode(ENVELOPE)
    assert blobs.items == {}
    await Codec(blobs, inline_limit=size - 1).encode(ENVELOPE)
    assert len(blobs.items) == 1


async def test_an_offloaded_event_is_not_read_for_another_tenant_or_without_a_blob_store() -> None:
    blobs = Blobs()
    stub = await Codec(blobs, inline_limit=10).encode(ENVELOPE)
    assert await Codec(blobs).decode(stub) == ENVELOPE  # no subject tenant: the envelope's own
    assert await Codec(blobs).decode(stub, tenant="acme") == ENVELOPE
    with pytest.raises(CodecError) as foreign:
        await Codec(blobs).decode(stub, tenant="evil")
    assert str(foreign.value) == (
        "event e1 names tenant 'acme' but is stored under 'evil': its payload is not read"
    )
    with pytest.raises(CodecError) as blind:
        await Codec().decode(stub)
    assert str(blind.value) == "event e1 is offloaded and this codec has no blob store"
