"""Reading and writing runtime settings in the `fleet-config` KV bucket.

A tenant's value wins over the global one, which wins over the built-in default. Reads go to
the bucket each time (a KV get is a direct get: ~0.2 ms), so a change applies to the next
decision on every replica without a restart.
"""

import logging
import os
from collections.abc import Mapping

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from fleet_events import streams
from fleet_events.config import SETTINGS, global_key, setting, tenant_key

log = logging.getLogger("fleet.config")


class RuntimeConfig:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> "RuntimeConfig":
        return cls(await js.key_value(streams.CONFIG.bucket))

    async def _read(self, key: str) -> str | None:
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return None
        return entry.value.decode() if entry.value else None

    async def get(self, key: str, *, tenant: str | None = None) -> str:
        spec = setting(key)
        if tenant is not None:
            value = await self._read(tenant_key(tenant, key))
            if value is not None:
                return value
        value = await self._read(global_key(key))
        return spec.default if value is None else value

    async def get_int(self, key: str, *, tenant: str | None = None) -> int:
        return int(await self.get(key, tenant=tenant))

    async def set(self, key: str, value: str, *, tenant: str | None = None) -> int:
        """Validate and store; returns the KV revision (the bucket keeps the history)."""
        setting(key).validate(value)
        target = global_key(key) if tenant is None else tenant_key(tenant, key)
        return await self._kv.put(target, value.encode())


async def seed_from_env(js: JetStreamContext, env: Mapping[str, str] | None = None) -> list[str]:
    """Write each setting whose env var is set, only where the bucket has no value yet."""
    env = os.environ if env is None else env
    kv = await js.key_value(streams.CONFIG.bucket)
    seeded = []
    for spec in SETTINGS:
        raw = env.get(spec.env)
        if raw is None:
            continue
        value = spec.validate(raw.strip())
        try:
            await kv.create(global_key(spec.key), value.encode())
            seeded.append(spec.key)
        except KeyWrongLastSequenceError:
            log.info("setting already stored; env not applied", extra={"setting": spec.key})
    return seeded
