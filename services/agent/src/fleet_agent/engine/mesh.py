"""One `EngineMesh` per tenant on this replica, made on first use and kept.

dspy calls the LM, the interpreter and the recorder synchronously from its own threads, so
every handle the engine uses lives on a `SandboxBus` (an event loop in a thread of its own,
with its own connection) rather than on the service's loop, which the turn worker is
awaiting on. A bus names one tenant in every sandbox request, hence one per tenant.
"""

import asyncio

from nacl.public import PrivateKey

from fleet_agent.engine.model import EngineMesh
from fleet_agent.lm import LmServices
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import Actor, streams
from fleet_events.codec import Codec
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader
from fleet_mesh.store import open_store


class MeshPool:
    def __init__(self, url: str, actor: Actor, private_key: PrivateKey) -> None:
        self._url = url
        self._actor = actor
        self._key = private_key
        self._meshes: dict[str, EngineMesh] = {}
        self._lock = asyncio.Lock()

    async def get(self, tenant: str) -> EngineMesh:
        async with self._lock:
            mesh = self._meshes.get(tenant)
            if mesh is None:
                mesh = await asyncio.to_thread(self._open, tenant)
                self._meshes[tenant] = mesh
            return mesh

    def _open(self, tenant: str) -> EngineMesh:
        bus = SandboxBus(self._url, tenant=tenant, name=f"agent-engine-{tenant}").start()
        js = bus.nc.jetstream()
        lm = LmServices(
            nc=bus.nc,
            llm=bus.run(LlmConfig.open(js), timeout=10),
            secrets=bus.run(SecretsReader.open_reader(js, self._key), timeout=10),
        )
        store = bus.run(open_store(js, streams.SESSIONS), timeout=10)
        codec = Codec(bus.run(JetStreamBlobs.open(js), timeout=10))
        return EngineMesh(bus=bus, lm=lm, store=store, codec=codec, actor=self._actor)

    def close(self) -> None:
        for mesh in self._meshes.values():
            mesh.bus.close()
        self._meshes.clear()
