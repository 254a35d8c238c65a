"""The file verbs: workspace files in and out (inline or through the object store), and
durable volumes browsed and read from any replica."""

import asyncio
import functools

from fleet_events import sandbox as sb
from fleet_events.codec import sha256_hex
from fleet_sandbox_broker.broker import Broker
from fleet_sandbox_broker.errors import BadSpec


class Files:
    def __init__(self, broker: Broker, reply_budget: int) -> None:
        self.b = broker
        self.reply_budget = reply_budget

    async def put_file(self, req: sb.PutFile) -> sb.FileInfo:
        held = self.b.get_held(req.tenant, req.sandbox)
        if req.blob is not None:
            data = await self.b.blobs.get(req.tenant, req.blob.sha256)
        elif req.data is not None:
            data = req.data
        else:
            raise BadSpec("put needs `data` (inline) or `blob` (an object-store reference)")
        await held.box.write_file(req.path, data)
        return sb.FileInfo(path=req.path, size=len(data), sha256=sha256_hex(data))

    async def get_file(self, req: sb.GetFile) -> sb.FileContent:
        """Inline answers bigger than the reply limit are refused by the routes, saying to ask
        with `via_blob` (the object store has no such limit)."""
        held = self.b.get_held(req.tenant, req.sandbox)
        data = await held.box.read_file(req.path, req.max_bytes)
        digest = sha256_hex(data)
        if req.via_blob:
            ref = await self.b.blobs.put(req.tenant, data)
            return sb.FileContent(path=req.path, size=len(data), sha256=digest, blob=ref)
        return sb.FileContent(path=req.path, size=len(data), sha256=digest, data=data)

    async def volume_list(self, req: sb.ListVolume) -> sb.VolumeListing:
        return await asyncio.to_thread(
            self.b.volumes.listing, req.tenant, req.volume, req.path, min(req.max_entries, 10_000)
        )

    async def volume_read(self, req: sb.ReadVolumeFile) -> sb.FileContent:
        # base64 on the wire: a read this size still fits in the reply
        cap = min(req.max_bytes, (self.reply_budget - 4096) * 3 // 4)
        data = await asyncio.to_thread(
            functools.partial(self.b.volumes.read, prefix=req.prefix),
            req.tenant, req.volume, req.path, cap,
        )  # fmt: skip
        return sb.FileContent(path=req.path, size=len(data), sha256=sha256_hex(data), data=data)
