"""Which model the mesh uses, and pointing the default profile at the local server.

Precedence, so that the embedded model never shadows a real one: `FLEET_LLM_*` in the
environment, then a stored profile that is not the local one, then the local server. The local
profile is recognised by its secret reference and model; only that profile is ever rewritten
(its address, when the server's port changed), never an operator's.
"""

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

from nacl.public import PublicKey
from nats.js import JetStreamContext

from fleet_cli.localllm.server import MODEL_ALIAS
from fleet_events import streams
from fleet_events.llm import DEFAULT_PROFILE, ROLES, LlmProfile, profile_key
from fleet_mesh.runtime_config import MODEL_ENV, LlmConfig, seed_llm_from_env
from fleet_mesh.secrets import SecretsWriter

LOCAL_KEY_REF = "local-llm-key"
LOCAL_MODEL = f"openai/{MODEL_ALIAS}"
# A 0.5B model on CPU answers a long RLM prompt in tens of seconds, not the default minute.
LOCAL_TIMEOUT_S = 600.0
# Its answers are a few hundred tokens; past that it is looping (at ~25 tokens/s on 2 cores a
# runaway reply would hold a turn for minutes), and the server honours this as `max_tokens`.
LOCAL_MAX_TOKENS = 1024
LOCAL_SEED = 7


def env_configured(env: Mapping[str, str]) -> str | None:
    if env.get(MODEL_ENV, "").strip():
        return f"{MODEL_ENV} is set"
    return None


def is_local(profile: LlmProfile) -> bool:
    if profile.secret != LOCAL_KEY_REF or profile.model != LOCAL_MODEL or not profile.api_base:
        return False
    host = urlsplit(profile.api_base).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_profile(api_base: str) -> LlmProfile:
    # temperature 0 and a seed: the small model is only usable deterministic (same output twice
    # measured); server_kind llama.cpp: the limit in `max_tokens` and the adapter's fields
    # enforced by a grammar (fleet_agent.llm_wire)
    return LlmProfile(
        name=DEFAULT_PROFILE,
        model=LOCAL_MODEL,
        api_base=api_base,
        secret=LOCAL_KEY_REF,
        timeout_s=LOCAL_TIMEOUT_S,
        max_tokens=LOCAL_MAX_TOKENS,
        temperature=0.0,
        seed=LOCAL_SEED,
        server_kind="llama.cpp",
    )


async def stored_elsewhere(llm: LlmConfig) -> str | None:
    """What stored global configuration names a model other than the local one, if any."""
    for role in ROLES:
        name = await llm.role(role, tenant=None)
        if name is None:
            continue
        stored = await llm.get_profile(name)
        if stored is not None and not is_local(stored.profile):
            return f"role {role} uses the stored profile {name!r} ({stored.profile.model})"
    default = await llm.get_profile(DEFAULT_PROFILE)
    if default is not None and not is_local(default.profile):
        return f"the stored profile {DEFAULT_PROFILE!r} names {default.profile.model}"
    return None


async def point_default_at(
    js: JetStreamContext, api_base: str, key: str, public_key: PublicKey
) -> list[str]:
    """Seal the key into the secrets store and make `default` (and every unbound role) the
    local server. Returns what changed; an operator's profile is left as it is."""
    llm = await LlmConfig.open(js)
    wanted = local_profile(api_base)
    changed: list[str] = []
    writer = await SecretsWriter.open(js, public_key)
    await writer.put(LOCAL_KEY_REF, key)
    stored = await llm.get_profile(DEFAULT_PROFILE)
    if stored is None:
        await llm.put_profile(wanted, expect=0)
        changed.append(f"llm profile {DEFAULT_PROFILE} -> {api_base}")
    elif is_local(stored.profile) and stored.profile != wanted:
        await llm.put_profile(wanted, expect=stored.revision)
        changed.append(f"llm profile {DEFAULT_PROFILE} -> {api_base}")
    for role in ROLES:
        if await llm.seed_role(role, DEFAULT_PROFILE):
            changed.append(f"llm role {role}")
    return changed


async def hand_over_to_env(
    js: JetStreamContext, env: Mapping[str, str], public_key: PublicKey | None
) -> list[str]:
    """`FLEET_LLM_*` set on a mesh whose default profile is still the local one seeded by an
    earlier start: the bootstrap's seed never overwrites a stored profile, so without this the
    environment would lose to the embedded model. Only the local profile is replaced."""
    llm = await LlmConfig.open(js)
    stored = await llm.get_profile(DEFAULT_PROFILE)
    if stored is None or not is_local(stored.profile):
        return []
    kv = await js.key_value(streams.CONFIG.bucket)
    await kv.delete(profile_key(DEFAULT_PROFILE), last=stored.revision)
    return await seed_llm_from_env(js, env, public_key=public_key)
