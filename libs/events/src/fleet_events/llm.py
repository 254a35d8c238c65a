"""LLM profiles and roles, as they are stored in the `fleet-config` KV bucket, and the agent's
`status` / `test_lm` verbs.

A **profile** says how to reach one model: a LiteLLM model string, the server's address,
timeouts, limits, and prices per million tokens (so cost caps hold for local and custom models,
which LiteLLM's offline cost map prices at 0). It holds a *reference* to a secret, never a key:
keys live in the sealed secrets store (`fleet_mesh.secrets`), so a profile can be shown, logged
and kept in the bucket's history without leaking anything.

A **role** (`planner`, `delegate`, `delegate_small`, `reflection`) names the profile a part of
the agent uses, per tenant with a global fallback like every setting. Rotating a key is a new
secret and a compare-and-set of the profile onto it.
"""

import math
import re
from datetime import datetime
from typing import Any, Literal

import msgspec

from fleet_events.ids import check_id

LLM_FAILURES = (
    "llm_timeout",
    "llm_rate_limited",
    "llm_quota_exceeded",
    "llm_auth_failed",
    "llm_unreachable",
    "llm_unavailable",
    "llm_context_exceeded",
    "llm_model_not_found",
    "llm_bad_request",
    "llm_error",
)
"""Every code a failed model call is recorded under (`run.llm_called.error_code`,
`run.failed.reason`, `turn.failed.code`); the agent's `llm_failures` says which is which."""

Role = Literal["planner", "delegate", "delegate_small", "reflection"]
ROLES: tuple[Role, ...] = ("planner", "delegate", "delegate_small", "reflection")
ROLE_USE = {
    "planner": "the chat agent and a run's own RLM steps",
    "delegate": "llm_query, sub-agents and child runs",
    "delegate_small": "cheap sub calls (llm_query_batched fan-out)",
    "reflection": "GEPA reflection in optimization runs",
}
DEFAULT_PROFILE = "default"

ServerKind = Literal["generic", "llama.cpp"]
SERVER_KINDS: tuple[ServerKind, ...] = ("generic", "llama.cpp")
"""What the model server is, for the request fields it honours. `generic`: send what dspy
sends (any provider, vLLM, Ollama). `llama.cpp` (llama-cpp-python's server): the token limit
goes in `max_tokens` (it ignores `max_completion_tokens`), the adapter's output fields are
enforced with a grammar (the chat adapter) or `json_object` with a `schema` (the JSON adapter;
it refuses `json_schema`)."""

MAX_TIMEOUT_S = 3600.0
MAX_PRICE_PER_MTOK = 100_000.0
MAX_TOKENS_LIMIT = 10_000_000
MAX_SEED = 2**31 - 1


class InvalidProfile(ValueError):
    """A profile or role that cannot be stored; the message says which field, value and fix."""


class Prices(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Money per one million tokens, in the tenant's budget currency."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0


class LlmProfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    model: str
    api_base: str | None = None
    secret: str | None = None
    timeout_s: float = 60.0
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    server_kind: ServerKind = "generic"
    prices: Prices = Prices()


def cost(prices: Prices, prompt_tokens: int, completion_tokens: int) -> float:
    """What a call cost at the profile's prices (not LiteLLM's map, which knows no local model)."""
    return (
        prompt_tokens * prices.input_per_mtok + completion_tokens * prices.output_per_mtok
    ) / 1_000_000


# -- validation --------------------------------------------------------------------------------

_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")
_BASE = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/%-]*)?")
_KEY_FIELDS = ("api_key", "key", "token", "password", "secret_value")


def _bad(field: str, value: object, fix: str) -> InvalidProfile:
    shown = value if field not in _KEY_FIELDS else "<hidden>"
    return InvalidProfile(f"profile field {field!r} cannot be {shown!r}: {fix}")


def check_profile(profile: LlmProfile) -> LlmProfile:
    check_profile_name(profile.name)
    if not _MODEL.fullmatch(profile.model):
        raise _bad(
            "model",
            profile.model,
            "give a LiteLLM model string such as 'openai/gpt-4o-mini' or "
            "'openai/<name>' for any OpenAI-compatible server (no spaces, at most 200 characters)",
        )
    if profile.api_base is not None:
        check_api_base(profile.api_base)
    if profile.secret is not None:
        check_secret_name(profile.secret)
    if not (math.isfinite(profile.timeout_s) and 0 < profile.timeout_s <= MAX_TIMEOUT_S):
        raise _bad("timeout_s", profile.timeout_s, f"use seconds above 0, at most {MAX_TIMEOUT_S}")
    if profile.max_tokens is not None and not 1 <= profile.max_tokens <= MAX_TOKENS_LIMIT:
        raise _bad("max_tokens", profile.max_tokens, f"use 1 to {MAX_TOKENS_LIMIT} or leave it out")
    if profile.temperature is not None and not (
        math.isfinite(profile.temperature) and 0 <= profile.temperature <= 2
    ):
        raise _bad("temperature", profile.temperature, "use 0 to 2, or leave it out")
    if profile.seed is not None and not 0 <= profile.seed <= MAX_SEED:
        raise _bad("seed", profile.seed, f"use 0 to {MAX_SEED}, or leave it out")
    if profile.server_kind not in SERVER_KINDS:
        raise _bad("server_kind", profile.server_kind, f"use one of {', '.join(SERVER_KINDS)}")
    for name in ("input_per_mtok", "output_per_mtok"):
        price = getattr(profile.prices, name)
        if not (math.isfinite(price) and 0 <= price <= MAX_PRICE_PER_MTOK):
            raise _bad(
                f"prices.{name}",
                price,
                f"use a price per million tokens from 0 to {MAX_PRICE_PER_MTOK:g}",
            )
    return profile


def check_profile_name(name: str) -> str:
    try:
        return check_id("profile", name)
    except ValueError as exc:
        raise InvalidProfile(str(exc)) from None


def check_secret_name(name: str) -> str:
    try:
        return check_id("secret", name)
    except ValueError as exc:
        raise InvalidProfile(
            f"{exc}; a profile names a secret of the secrets store, it never holds a key"
        ) from None


def check_api_base(api_base: str) -> str:
    if "@" in api_base or "?" in api_base or "#" in api_base:
        # never echo it: a URL with userinfo or a query may carry a credential
        raise InvalidProfile(
            "profile field 'api_base' must not carry credentials, a query or a fragment: give "
            "the server's address only (scheme, host, port, path) and put the key in the "
            "secrets store"
        )
    if not _BASE.fullmatch(api_base):
        raise _bad(
            "api_base",
            api_base,
            "give an http:// or https:// address such as http://127.0.0.1:8080/v1",
        )
    return api_base


def check_role(role: str) -> Role:
    for known in ROLES:
        if role == known:
            return known
    raise InvalidProfile(f"unknown LLM role {role!r}: roles are {', '.join(ROLES)}")


_profile_decoder = msgspec.json.Decoder(LlmProfile)


def decode_profile(data: bytes) -> LlmProfile:
    """Decode and validate a profile written by anyone (the gateway, an operator's CLI)."""
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidProfile(f"a profile must be a JSON object: {exc}") from None
    if isinstance(raw, dict):
        for leaked in _KEY_FIELDS:
            if leaked in raw:
                raise InvalidProfile(
                    f"profile field {leaked!r} is refused: a profile holds a secret reference "
                    "('secret': '<name>'), never a key; store the key in the secrets store"
                )
    try:
        profile = _profile_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidProfile(f"malformed profile: {exc}") from None
    return check_profile(profile)


def encode_profile(profile: LlmProfile) -> bytes:
    return msgspec.json.encode(check_profile(profile))


# -- where they live in the config bucket ----------------------------------------------------


def profile_key(name: str, tenant: str | None = None) -> str:
    check_profile_name(name)
    if tenant is None:
        return f"global.llm.profile.{name}"
    return f"tenant.{check_id('tenant', tenant)}.llm.profile.{name}"


def role_key(role: str, tenant: str | None = None) -> str:
    check_role(role)
    if tenant is None:
        return f"global.llm.role.{role}"
    return f"tenant.{check_id('tenant', tenant)}.llm.role.{role}"


# -- the agent's verbs ---------------------------------------------------------------------------


class GetAgentStatus(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str


class RoleStatus(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    profile: str | None
    model: str | None = None
    api_base: str | None = None
    has_secret: bool = False
    secret_found: bool = False
    problem: str = ""
    global_profile: bool = False
    """The profile is the deployment's (global scope), not the tenant's own: its address is
    the operator's, shown to admins only."""


class AgentStatus(msgspec.Struct, frozen=True, kw_only=True):
    replica: str
    tenant: str
    ready: bool
    roles: list[RoleStatus]
    guidance: list[str] = []


class TestLm(msgspec.Struct, frozen=True, kw_only=True):
    """Probe a role's profile with "Reply with exactly OK" (or a named profile)."""

    __test__ = False  # not a pytest class, whatever its name

    tenant: str
    role: str = "planner"
    profile: str | None = None
    timeout_s: float = 20.0


class LmCheck(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    ok: bool
    detail: str = ""


class TestLmResult(msgspec.Struct, frozen=True, kw_only=True):
    """The earlier system's probe result: {kind, ok, preflight_ok, checked_at, checks,
    guidance, latency_ms, output_preview, error}."""

    __test__ = False

    kind: str = "lm"
    ok: bool
    preflight_ok: bool
    checked_at: datetime
    checks: list[LmCheck]
    guidance: list[str] = []
    latency_ms: float | None = None
    output_preview: str = ""
    error: str = ""
    profile: str | None = None
    model: str | None = None


# -- the embedded model's state (written by `fleet up`, read by the gateway and the agent) ------

LocalState = Literal["installing", "building", "loading", "up", "failed", "stopped"]
STARTING: frozenset[str] = frozenset({"installing", "building", "loading"})
"""The states on the way up: the mesh serves meanwhile, and a call to the model waits."""
LOCAL_MODEL_KEY = "global.llm.local"
"""Where `fleet up` keeps the embedded model's state in the config bucket (absent: this mesh
runs no local model)."""


class LocalModelState(msgspec.Struct, frozen=True, kw_only=True):
    """The embedded model as `fleet up` last saw it: its install step, or up with the speed it
    measured when the server first answered (one short streamed completion)."""

    state: LocalState
    model: str
    updated_at: datetime
    api_base: str | None = None
    detail: str = ""
    advice: str = ""
    first_token_ms: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    """While starting: the seconds left, estimated from the steps still to do (None: no
    estimate)."""


def minutes_left(eta_s: float) -> str:
    """`~N min left`, rounded up; under a minute says so."""
    if eta_s < 60:
        return "under a minute left"
    return f"~{-(-int(eta_s) // 60)} min left"


def local_state_line(state: LocalModelState) -> str:
    """One line for a person: what it is doing, where, how long it still needs, how fast."""
    where = f" at {state.api_base}" if state.api_base else ""
    line = f"{state.state}: {state.model}{where}"
    if state.state in STARTING and state.eta_s is not None:
        line += f", {minutes_left(state.eta_s)}"
    if state.first_token_ms is not None and state.tokens_per_s is not None:
        line += f"; first token {state.first_token_ms:.0f} ms, {state.tokens_per_s:.1f} tokens/s"
    return f"{line} ({state.detail})" if state.detail else line


_local_decoder = msgspec.json.Decoder(LocalModelState)


def decode_local_state(data: bytes) -> LocalModelState | None:
    """The stored state, or None for bytes that are not one (never an exception: a reader
    reporting health must not fail on it)."""
    try:
        return _local_decoder.decode(data)
    except msgspec.DecodeError:
        return None


def profile_summary(profile: LlmProfile) -> dict[str, Any]:
    """What may be shown of a profile anywhere (it holds no key, so this is all of it)."""
    return msgspec.to_builtins(profile)  # type: ignore[no-any-return]
