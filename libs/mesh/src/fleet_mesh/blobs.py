"""The codec's blob store on a JetStream object store, scoped by tenant.

Names are `<tenant>/<sha256>`, built here from a validated tenant id and a 64-hex digest, so a
read on behalf of one tenant can never name another tenant's object.
"""

import asyncio
import re

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from fleet_events import BlobRef, check_id, streams
from fleet_events.codec import sha256_hex

_DIGEST = re.compile(r"[0-9a-f]{64}")


class BlobNotFound(LookupError):
    pass


class InvalidDigest(ValueError):
    pass


class BlobUnavailable(RuntimeError):
    """The object store did not hand the blob's chunks over in time (it never will if they
    were replaced under the reader: see `JetStreamBlobs.get`)."""


def blob_name(tenant: str, sha256: str) -> str:
    if _DIGEST.fullmatch(sha256) is None:
        raise InvalidDigest(
            f"invalid blob digest {sha256[:80]!r}: expected 64 lowercase hex digits"
        )
    return f"{check_id('tenant', tenant)}/{sha256}"


GET_TIMEOUT_S = 30.0
"""Per try: generous for a large document on a loaded machine; a read that is stuck stays stuck."""


class JetStreamBlobs:
    def __init__(self, store: ObjectStore, *, get_timeout_s: float = GET_TIMEOUT_S) -> None:
        self._store = store
        self._get_timeout_s = get_timeout_s

    @classmethod
    async def open(cls, js: JetStreamContext) -> "JetStreamBlobs":
        return cls(await js.object_store(streams.BLOBS.bucket))

    async def put(self, tenant: str, data: bytes) -> BlobRef:
        digest = sha256_hex(data)
        name = blob_name(tenant, digest)
        try:
            info = await self._store.get_info(name)
            exists = info.size == len(data) and not info.deleted
        except (NotFoundError, ObjectNotFoundError):
            exists = False
        if not exists:
            await self._store.put(name, data)
        return BlobRef(object=name, sha256=digest, size=len(data))

    async def get(self, tenant: str, sha256: str) -> bytes:
        name = blob_name(tenant, sha256)
        data = await self._read(name, tenant, sha256)
        if sha256_hex(data) != sha256:
            raise BlobNotFound(f"blob {name} is corrupt: its bytes do not match its digest")
        return data

    async def _read(self, name: str, tenant: str, sha256: str) -> bytes:
        """nats-py's `ObjectStore.get` reads the object's info, then waits, with no bound, for
        the chunks it names. A writer putting the same blob at that moment (two sessions
        uploading one file) replaces those chunks, and the wait never ends. So each read is
        bounded, and one that times out is tried again: the second reads the new info."""
        for attempt in (1, 2):
            try:
                result = await asyncio.wait_for(self._store.get(name), self._get_timeout_s)
            except (NotFoundError, ObjectNotFoundError) as exc:
                raise BlobNotFound(f"no blob {sha256} for tenant {tenant}") from exc
            except TimeoutError:
                if attempt == 2:
                    raise BlobUnavailable(
                        f"blob {name}: its chunks did not arrive within {self._get_timeout_s}s "
                        "twice; the object store is overloaded or the object is damaged"
                    ) from None
                continue
            return result.data or b""
        raise AssertionError("unreachable")
