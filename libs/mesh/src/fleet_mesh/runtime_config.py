"""Reading and writing runtime settings, LLM profiles and roles in the `fleet-config` KV bucket.

A tenant's value wins over the global one, which wins over the built-in default. Reads go to
the bucket each time (a KV get is a direct get: ~0.2 ms), so a change applies to the next
decision on every replica without a restart.
"""

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from nacl.public import PublicKey
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from fleet_events import streams
from fleet_events.config import SETTINGS, global_key, setting, tenant_key
from fleet_events.llm import (
    DEFAULT_PROFILE,
    LOCAL_MODEL_KEY,
    ROLES,
    InvalidProfile,
    LlmProfile,
    LocalModelState,
    check_profile,
    check_profile_name,
    decode_local_state,
    decode_profile,
    encode_profile,
    profile_key,
    role_key,
)
from fleet_mesh.secrets import PRIVATE_KEY_ENV, PUBLIC_KEY_ENV, SecretsWriter

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

    async def stored_int(self, key: str, *, tenant: str) -> int | None:
        """The tenant's value, else the global one; None when neither is stored (the caller's
        own default applies: a service's environment seeds what no one set)."""
        setting(key)
        for target in (tenant_key(tenant, key), global_key(key)):
            value = await self._read(target)
            if value is not None:
                return int(value)
        return None

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


# -- LLM profiles and roles ----------------------------------------------------------------------


class ProfileNotFound(LookupError):
    pass


class ProfileConflict(RuntimeError):
    """A compare-and-set lost: the profile changed since the revision the writer read."""


@dataclass(frozen=True)
class StoredProfile:
    """A profile with where it was found: `tenant` None is the global scope, and a profile's
    secret is resolved in the profile's own scope, never another."""

    profile: LlmProfile
    tenant: str | None
    revision: int


class LlmConfig:
    """Profiles and roles in the config bucket, validated on every write."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> "LlmConfig":
        return cls(await js.key_value(streams.CONFIG.bucket))

    async def put_profile(
        self, profile: LlmProfile, *, tenant: str | None = None, expect: int | None = None
    ) -> int:
        """Store `profile`; with `expect`, only if its stored revision is still `expect`
        (0: only if there is none). Rotation is a new secret plus this compare-and-set."""
        key = profile_key(profile.name, tenant)
        data = encode_profile(profile)
        if expect is None:
            return await self._kv.put(key, data)
        try:
            if expect == 0:
                return await self._kv.create(key, data)
            return await self._kv.update(key, data, last=expect)
        except KeyWrongLastSequenceError:
            raise ProfileConflict(
                f"profile {profile.name!r} changed since revision {expect}: read it again and "
                "retry the change"
            ) from None

    async def local_model(self) -> LocalModelState | None:
        """The embedded model's state as `fleet up` last wrote it (None: this mesh runs none)."""
        try:
            entry = await self._kv.get(LOCAL_MODEL_KEY)
        except KeyNotFoundError:
            return None
        return decode_local_state(entry.value or b"")

    async def get_profile(self, name: str, *, tenant: str | None = None) -> StoredProfile | None:
        """The profile `name` in exactly this scope."""
        try:
            entry = await self._kv.get(profile_key(name, tenant))
        except KeyNotFoundError:
            return None
        if not entry.value or entry.revision is None:
            return None
        return StoredProfile(decode_profile(entry.value), tenant, entry.revision)

    async def find_profile(self, name: str, *, tenant: str | None) -> StoredProfile:
        """The tenant's profile `name`, else the global one."""
        if tenant is not None:
            found = await self.get_profile(name, tenant=tenant)
            if found is not None:
                return found
        found = await self.get_profile(name)
        if found is None:
            raise ProfileNotFound(
                f"no LLM profile {name!r} for tenant {tenant} or globally: create it, or point "
                "FLEET_LLM_MODEL (and FLEET_LLM_API_BASE, FLEET_LLM_API_KEY) at a model server "
                "and bootstrap again"
            )
        return found

    async def set_role(self, role: str, profile: str, *, tenant: str | None = None) -> int:
        check_profile_name(profile)
        return await self._kv.put(role_key(role, tenant), profile.encode())

    async def seed_role(self, role: str, profile: str) -> bool:
        """Bind a global role only if it is unbound (what the bootstrap does)."""
        check_profile_name(profile)
        try:
            await self._kv.create(role_key(role), profile.encode())
        except KeyWrongLastSequenceError:
            return False
        return True

    async def role(self, role: str, *, tenant: str | None) -> str | None:
        """The profile name of `role`: the tenant's binding, else the global one."""
        keys = [role_key(role, tenant)] if tenant is not None else []
        for key in [*keys, role_key(role)]:
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                return entry.value.decode()
        return None

    async def resolve(self, role: str, *, tenant: str | None) -> StoredProfile:
        name = await self.role(role, tenant=tenant)
        if name is None:
            raise ProfileNotFound(
                f"LLM role {role!r} names no profile for tenant {tenant} or globally: set the "
                f"role, or seed the default profile from FLEET_LLM_MODEL at bootstrap"
            )
        return await self.find_profile(name, tenant=tenant)


DEFAULT_KEY_REF = "default-llm-key"
MODEL_ENV, API_BASE_ENV, API_KEY_ENV = "FLEET_LLM_MODEL", "FLEET_LLM_API_BASE", "FLEET_LLM_API_KEY"


class SeedRefused(ValueError):
    pass


async def seed_llm_from_env(
    js: JetStreamContext,
    env: Mapping[str, str] | None = None,
    *,
    public_key: PublicKey | None = None,
) -> list[str]:
    """`FLEET_LLM_*` seed the global `default` profile and every role naming it, only where
    nothing is stored yet. The key is sealed into the secrets store; the profile holds its
    name. A stored profile is never overwritten (change it through the config API)."""
    env = os.environ if env is None else env
    model = env.get(MODEL_ENV, "").strip()
    api_key = env.get(API_KEY_ENV, "").strip()
    if not model:
        if api_key or env.get(API_BASE_ENV):
            raise SeedRefused(
                f"{API_KEY_ENV} or {API_BASE_ENV} is set without {MODEL_ENV}: set the model too "
                "(a LiteLLM string such as openai/<name> for an OpenAI-compatible server)"
            )
        return []
    if api_key and public_key is None:
        raise SeedRefused(
            f"{API_KEY_ENV} is set but the bootstrap has no services' public key to seal it "
            f"with: set {PUBLIC_KEY_ENV} (or {PRIVATE_KEY_ENV}) to the key file"
        )
    api_base = env.get(API_BASE_ENV, "").strip() or None
    try:
        profile = check_profile(
            LlmProfile(
                name=DEFAULT_PROFILE,
                model=model,
                api_base=api_base,
                secret=DEFAULT_KEY_REF if api_key else None,
            )
        )
    except InvalidProfile as exc:
        raise SeedRefused(f"the FLEET_LLM_* environment is refused: {exc}") from None
    llm = await LlmConfig.open(js)
    seeded: list[str] = []
    try:
        await llm.put_profile(profile, expect=0)
        seeded.append(f"llm profile {DEFAULT_PROFILE}")
        if api_key and public_key is not None:
            writer = await SecretsWriter.open(js, public_key)
            await writer.put(DEFAULT_KEY_REF, api_key)
            seeded.append(f"secret {DEFAULT_KEY_REF}")
    except ProfileConflict:
        log.info("llm profile already stored; FLEET_LLM_* not applied")
    for role in ROLES:
        if await llm.seed_role(role, DEFAULT_PROFILE):
            seeded.append(f"llm role {role}")
    return seeded
