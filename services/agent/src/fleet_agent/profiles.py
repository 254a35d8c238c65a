"""The agent's view of its LLM configuration, served on the bus: `agent.status` (which profile
and model each role of a tenant uses, and what is missing) and `agent.test_lm` (the earlier
system's probe: preflight checks, then "Reply with exactly OK").

Both read the config and secrets stores at each request, so they report what the next model
call would use. The probe is an operator's check outside any turn: it is not charged to a
budget tree. Nothing either answers carries a key; error text is scrubbed of it. When the
profile is the embedded model `fleet up` serves (its address is the one in the stored
`LocalModelState`), the probe adds a `local_model` check: installing, building, loading or up
with the speed measured at start, and what to do when it is not up.
"""

import asyncio
import logging
import time
from dataclasses import dataclass

from dspy.clients.engines.litellm_engine import LiteLLMEngine
from dspy.lm15 import Config, Message, Request
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from fleet_agent.llm_failures import classify
from fleet_agent.lm import NO_KEY, scrub
from fleet_agent.lm_errors import call_site
from fleet_events import bus, check_id, streams, utc_now
from fleet_events.addresses import AddressRefused
from fleet_events.llm import (
    LOCAL_MODEL_KEY,
    ROLES,
    AgentStatus,
    GetAgentStatus,
    InvalidProfile,
    LmCheck,
    LocalModelState,
    RoleStatus,
    TestLm,
    TestLmResult,
    check_profile_name,
    check_role,
    decode_local_state,
    local_state_line,
)
from fleet_mesh import egress
from fleet_mesh.rpc import BadRequest
from fleet_mesh.runtime_config import LlmConfig, ProfileNotFound, StoredProfile
from fleet_mesh.secrets import SecretError, SecretsReader, private_key_from_env
from fleet_mesh.service import ServiceContext

PROBE = "Reply with exactly OK"
PREVIEW_CHARS = 240
MAX_PROBE_S = 60.0
REQUIRED_ROLES = ("planner", "delegate")
LOCAL_NOT_UP = (
    "the embedded model is not up yet: fleet up installs (once, minutes), loads and then serves "
    "it; run `fleet doctor` or see <data-dir>/logs/llm.log"
)


@dataclass(frozen=True)
class LlmStores:
    llm: LlmConfig
    secrets: SecretsReader
    config: KeyValue | None = None
    """The config bucket itself, for the embedded model's state (None: not reported)."""

    async def local_model(self) -> LocalModelState | None:
        if self.config is None:
            return None
        try:
            entry = await self.config.get(LOCAL_MODEL_KEY)
        except KeyNotFoundError:
            return None
        return decode_local_state(entry.value or b"")


def _tenant(value: str) -> str:
    try:
        return check_id("tenant", value)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


async def _key(stores: LlmStores, stored: StoredProfile) -> str:
    if stored.profile.secret is None:
        return NO_KEY
    return await stores.secrets.get(stored.profile.secret, tenant=stored.tenant)


async def role_status(stores: LlmStores, role: str, tenant: str) -> RoleStatus:
    name = await stores.llm.role(role, tenant=tenant)
    if name is None:
        return RoleStatus(role=role, profile=None, problem="no profile is bound to this role")
    try:
        stored = await stores.llm.find_profile(name, tenant=tenant)
    except (ProfileNotFound, InvalidProfile) as exc:
        return RoleStatus(role=role, profile=name, problem=str(exc))
    profile = stored.profile
    found, problem = True, ""
    if profile.secret is not None:
        try:
            await _key(stores, stored)
        except SecretError as exc:
            found, problem = False, str(exc)
    return RoleStatus(
        role=role,
        profile=name,
        model=profile.model,
        api_base=profile.api_base,
        has_secret=profile.secret is not None,
        secret_found=profile.secret is not None and found,
        problem=problem,
        global_profile=stored.tenant is None,
    )


async def agent_status(stores: LlmStores, replica: str, request: GetAgentStatus) -> AgentStatus:
    tenant = _tenant(request.tenant)
    roles = [await role_status(stores, role, tenant) for role in ROLES]
    guidance = [f"{r.role}: {r.problem}" for r in roles if r.problem]
    ready = all(not r.problem for r in roles if r.role in REQUIRED_ROLES)
    if not ready:
        guidance.append(
            "point FLEET_LLM_MODEL (with FLEET_LLM_API_BASE and FLEET_LLM_API_KEY) at an "
            "OpenAI-compatible server and bootstrap again, or store a profile and bind the roles"
        )
    return AgentStatus(replica=replica, tenant=tenant, ready=ready, roles=roles, guidance=guidance)


log = logging.getLogger("fleet.agent.profiles")

PROBE_GUIDANCE = {
    "llm_timeout": "the model server answered too slowly: it may be busy (a local model under "
    "load is slower); ask again, or raise the profile's timeout_s",
    "llm_unreachable": "nothing answered at the profile's address: check api_base and that the "
    "server runs",
    "llm_auth_failed": "the server refused the key: store the right secret for the profile",
    "llm_model_not_found": "the server does not know the model: check the profile's model name",
    "llm_rate_limited": "the server is rate limiting this key: ask again later",
    "llm_quota_exceeded": "the key's quota or billing is spent: see the provider's account",
    "llm_error": "the model server failed: check the address, the key and the model name",
}
"""What to do after a failed probe, by the failure's kind (the earlier text always blamed the
address, the key or the model name, even for a server that was up and merely slow)."""


def _probe(stored: StoredProfile, key: str, timeout_s: float) -> str:
    profile = stored.profile
    engine = LiteLLMEngine(
        api_key=key, api_base=profile.api_base, timeout=timeout_s, wire_model=profile.model
    )
    request = Request(
        model=profile.model,
        messages=(Message.user(PROBE),),
        config=Config(temperature=0.0, max_tokens=16),
    )
    response = engine.complete(request)
    return "".join(getattr(part, "text", "") or "" for part in response.message.parts)


async def test_lm(stores: LlmStores, request: TestLm) -> TestLmResult:
    tenant = _tenant(request.tenant)
    if not 0 < request.timeout_s <= MAX_PROBE_S:
        raise BadRequest(f"timeout_s cannot be {request.timeout_s}: use 0 to {MAX_PROBE_S}")
    try:
        if request.profile is not None:
            check_profile_name(request.profile)
        else:
            check_role(request.role)
    except InvalidProfile as exc:
        raise BadRequest(str(exc)) from None
    checks: list[LmCheck] = []
    guidance: list[str] = []

    def result(
        *,
        ok: bool = False,
        latency_ms: float | None = None,
        output_preview: str = "",
        error: str = "",
        profile: str | None = None,
        model: str | None = None,
    ) -> TestLmResult:
        return TestLmResult(
            ok=ok,
            preflight_ok=all(c.ok for c in checks),
            checked_at=utc_now(),
            checks=checks,
            guidance=guidance,
            latency_ms=latency_ms,
            output_preview=output_preview,
            error=error,
            profile=profile,
            model=model,
        )

    try:
        if request.profile is not None:
            stored = await stores.llm.find_profile(request.profile, tenant=tenant)
        else:
            stored = await stores.llm.resolve(request.role, tenant=tenant)
    except (ProfileNotFound, InvalidProfile) as exc:
        checks.append(LmCheck(name="model_set", ok=False, detail=str(exc)))
        guidance.append("store a profile for this role, or seed one from FLEET_LLM_MODEL")
        return result()
    profile = stored.profile
    scope = f"tenant {tenant}" if stored.tenant else "global"
    checks.append(
        LmCheck(name="model_set", ok=True, detail=f"{profile.model} ({profile.name}, {scope})")
    )
    try:
        key = await _key(stores, stored)
        detail = (
            "the profile names no secret (a server that checks no key)"
            if profile.secret is None
            else f"secret {profile.secret!r} opens"
        )
        checks.append(LmCheck(name="api_key_set", ok=True, detail=detail))
    except SecretError as exc:
        checks.append(LmCheck(name="api_key_set", ok=False, detail=str(exc)))
        guidance.append(f"store the secret {profile.secret!r} in {scope} through the gateway")
        return result(profile=profile.name, model=profile.model)
    local = await stores.local_model()
    if local is not None and profile.api_base is not None and local.api_base == profile.api_base:
        checks.append(
            LmCheck(name="local_model", ok=local.state == "up", detail=local_state_line(local))
        )
        if local.state != "up":
            guidance.append(local.advice or LOCAL_NOT_UP)
            return result(profile=profile.name, model=profile.model)

    if stored.tenant is not None and profile.api_base is not None:
        try:
            await egress.acheck(profile.api_base)
        except AddressRefused as exc:
            checks.append(LmCheck(name="address", ok=False, detail=str(exc)))
            guidance.append("point the profile at the model server's public address")
            return result(error=f"address_not_public: {exc}", profile=profile.name,
                          model=profile.model)  # fmt: skip
    started = time.monotonic()
    try:
        text = await asyncio.wait_for(
            asyncio.to_thread(_probe, stored, key, request.timeout_s), request.timeout_s + 1
        )
    except Exception as exc:
        latency = round((time.monotonic() - started) * 1000, 1)
        # what failed, by its kind: never the peer's body or a traceback (a tenant's api_base
        # may point anywhere the agent reaches, and its answer would come back here); the
        # operator's log keeps the scrubbed text
        failure = classify(exc, call_site(profile, request.role))
        log.info(
            "lm probe failed",
            extra={"profile": profile.name, "code": failure.code,
                   "error": scrub(f"{type(exc).__name__}: {exc}", key)[:2000]},
        )  # fmt: skip
        guidance.append(PROBE_GUIDANCE.get(failure.code, PROBE_GUIDANCE["llm_error"]))
        return result(
            latency_ms=latency, error=f"{failure.code}: {failure.message}", profile=profile.name,
            model=profile.model,
        )  # fmt: skip
    latency = round((time.monotonic() - started) * 1000, 1)
    answered_ok = text.strip().strip(".").upper() == "OK"
    if not answered_ok:
        guidance.append(
            "the model answered, but not with exactly OK: it works, though a model this loose "
            "may not follow dspy's output format"
        )
    return result(
        ok=answered_ok,
        latency_ms=latency,
        output_preview=scrub(text, key)[:PREVIEW_CHARS],
        profile=profile.name,
        model=profile.model,
    )


test_lm.__test__ = False  # type: ignore[attr-defined]  # a handler, not a pytest test


async def register_agent_verbs(ctx: ServiceContext, stores: LlmStores) -> None:
    """Serve `agent.status` and `agent.test_lm` on `ctx` (for the agent's app.py setup)."""

    async def status(request: GetAgentStatus) -> AgentStatus:
        return await agent_status(stores, ctx.replica, request)

    async def probe(request: TestLm) -> TestLmResult:
        return await test_lm(stores, request)

    await ctx.serve(bus.AGENT_STATUS, status)
    await ctx.serve(bus.TEST_LM, probe, concurrency=4)


async def open_stores(ctx: ServiceContext, secrets: SecretsReader | None = None) -> LlmStores:
    """The stores on the service's connection; `secrets` given when the caller already holds
    the services' private key (`fleet_mesh.secrets.private_key_from_env`)."""
    if secrets is None:
        key = private_key_from_env()
        if key is None:
            raise SecretError(
                "the agent needs the services' private key: set FLEET_SECRETS_KEY to its file"
            )
        secrets = await SecretsReader.open_reader(ctx.js, key)
    return LlmStores(
        llm=await LlmConfig.open(ctx.js),
        secrets=secrets,
        config=await ctx.js.key_value(streams.CONFIG.bucket),
    )
