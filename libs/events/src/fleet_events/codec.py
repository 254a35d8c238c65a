"""Envelope <-> stored bytes, moving large envelopes to the object store.

An envelope whose encoding exceeds the inline limit is stored under `<tenant>/<sha256>` in
the object store; the log keeps an `Offloaded` stub naming it. The blob store is a protocol so
this module stays free of I/O libraries; `fleet_mesh.blobs` implements it on JetStream.
"""

import hashlib
from collections.abc import Iterable
from typing import Any, Protocol, Union

import msgspec

from fleet_events.catalog import ALL_EVENTS, type_of
from fleet_events.envelope import BlobRef, Envelope, Event, Offloaded

INLINE_LIMIT = 256 * 1024


class BlobStore(Protocol):
    async def put(self, tenant: str, data: bytes) -> BlobRef: ...

    async def get(self, tenant: str, sha256: str) -> bytes: ...


class CodecError(Exception):
    """Stored bytes that cannot be turned back into an envelope."""


class PayloadTooLarge(CodecError):
    pass


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Codec:
    def __init__(
        self,
        blobs: BlobStore | None = None,
        *,
        inline_limit: int = INLINE_LIMIT,
        events: Iterable[type[Event]] = ALL_EVENTS,
    ) -> None:
        self._blobs = blobs
        self._inline_limit = inline_limit
        union: Any = Union[tuple(events)]  # noqa: UP007 - runtime-built union
        self._encoder = msgspec.json.Encoder()
        self._decoder: msgspec.json.Decoder[Envelope[Any]] = msgspec.json.Decoder(Envelope[union])

    def encode_inline(self, envelope: Envelope[Any]) -> bytes:
        return self._encoder.encode(envelope)

    async def encode(self, envelope: Envelope[Any]) -> bytes:
        raw = self._encoder.encode(envelope)
        if len(raw) <= self._inline_limit:
            return raw
        if self._blobs is None:
            raise PayloadTooLarge(
                f"event {envelope.id} encodes to {len(raw)} bytes, over the inline limit of "
                f"{self._inline_limit}, and this codec has no object store to offload it to"
            )
        ref = await self._blobs.put(envelope.tenant, raw)
        stub = msgspec.structs.replace(
            envelope, data=Offloaded(blob=ref, of_type=type_of(envelope.data))
        )
        return self._encoder.encode(stub)

    def decode_stored(self, raw: bytes | memoryview) -> Envelope[Any]:
        """Decode exactly what is stored; an offloaded event stays an `Offloaded` stub."""
        try:
            return self._decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise CodecError(f"stored bytes are not a known envelope: {exc}") from exc

    async def decode(self, raw: bytes | memoryview, *, tenant: str | None = None) -> Envelope[Any]:
        """Decode stored bytes, fetching an offloaded payload from the blob store.

        `tenant` is the tenant the bytes were stored under (from the subject). Blobs are read
        for that tenant only, never for whatever tenant the stored envelope claims.
        """
        envelope = self.decode_stored(raw)
        if not isinstance(envelope.data, Offloaded):
            return envelope
        if self._blobs is None:
            raise CodecError(f"event {envelope.id} is offloaded and this codec has no blob store")
        owner = envelope.tenant if tenant is None else tenant
        if envelope.tenant != owner:
            raise CodecError(
                f"event {envelope.id} names tenant {envelope.tenant!r} but is stored under "
                f"{owner!r}: its payload is not read"
            )
        blob = envelope.data.blob
        full = await self._blobs.get(owner, blob.sha256)
        if sha256_hex(full) != blob.sha256 or len(full) != blob.size:
            raise CodecError(f"offloaded payload of event {envelope.id} does not match its digest")
        return self.decode_stored(full)
