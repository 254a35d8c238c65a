"""The codec: stored bytes <-> envelopes, offloading what is too large to keep inline."""

import msgspec
import pytest

from fleet_events import Actor, BlobRef, Envelope, new_id, utc_now
from fleet_events.codec import Codec, CodecError, PayloadTooLarge, sha256_hex
from fleet_events.envelope import Offloaded
from fleet_events.session import SessionRenamed, TurnRequested

ACTOR = Actor(service="test", replica="0")


def _env(message: str) -> Envelope[TurnRequested]:
    return Envelope(
        id=new_id(),
        tenant="acme",
        session="s1",
        actor=ACTOR,
        ts=utc_now(),
        data=TurnRequested(message=message),
    )


class MemoryBlobs:
    """An in-memory BlobStore: the codec's contract, not the object store (tested on NATS)."""

    def __init__(self) -> None:
        self.items: dict[str, bytes] = {}

    async def put(self, tenant: str, data: bytes) -> BlobRef:
        digest = sha256_hex(data)
        self.items[f"{tenant}/{digest}"] = data
        return BlobRef(object=f"{tenant}/{digest}", sha256=digest, size=len(data))

    async def get(self, tenant: str, sha256: str) -> bytes:
        return self.items[f"{tenant}/{sha256}"]


async def test_inline_envelopes_round_trip_with_their_tag() -> None:
    codec = Codec()
    env = _env("hello")
    raw = await codec.encode(env)
    assert b'"type":"turn.requested"' in raw
    assert await codec.decode(raw) == env


async def test_large_envelopes_need_a_blob_store_and_say_so() -> None:
    codec = Codec(inline_limit=100)
    with pytest.raises(PayloadTooLarge, match="over the inline limit of 100"):
        await codec.encode(_env("x" * 200))


async def test_large_envelopes_are_offloaded_and_restored() -> None:
    blobs = MemoryBlobs()
    codec = Codec(blobs, inline_limit=100)
    env = _env("x" * 500)
    stored = await codec.encode(env)
    stub = codec.decode_stored(stored)
    assert isinstance(stub.data, Offloaded)
    assert stub.id == env.id
    assert stub.data.of_type == "turn.requested"
    assert await codec.decode(stored) == env


async def test_a_swapped_blob_is_detected() -> None:
    blobs = MemoryBlobs()
    codec = Codec(blobs, inline_limit=100)
    stored = await codec.encode(_env("x" * 500))
    (name,) = blobs.items
    blobs.items[name] = blobs.items[name].replace(b"xxx", b"yyy", 1)
    with pytest.raises(CodecError, match="does not match its digest"):
        await codec.decode(stored)


def test_unknown_or_malformed_bytes_are_a_codec_error() -> None:
    codec = Codec()
    with pytest.raises(CodecError, match="not a known envelope"):
        codec.decode_stored(b'{"id": 1}')
    unknown = msgspec.json.encode(
        {
            "id": "a",
            "tenant": "t",
            "actor": {"service": "s", "replica": "r"},
            "ts": "2026-01-01T00:00:00Z",
            "data": {"type": "no.such.type"},
        }
    )
    with pytest.raises(CodecError, match=r"no\.such\.type"):
        codec.decode_stored(unknown)


def test_events_are_frozen() -> None:
    event = SessionRenamed(title="a")
    with pytest.raises(AttributeError):
        event.title = "b"  # type: ignore[misc]
