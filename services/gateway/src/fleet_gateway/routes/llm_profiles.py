"""The tenant's LLM profiles in the config KV, with their API keys sealed into the secrets store.

- `GET /api/v1/runtime/llm-profiles`, `GET /api/v1/runtime/llm-profiles/{name}`: the tenant's
  own profiles (global ones are the operator's and not listed here).
- `POST /api/v1/runtime/llm-profiles`: create one (409 if the name is taken). An `api_key` in
  the body is sealed with the services' PUBLIC key (`FLEET_SECRETS_PUBLIC_KEY`, or derived from
  `FLEET_SECRETS_KEY`) under the secret name `llm-<profile>`; the profile holds that name only.
  The gateway can seal but never open, so nothing it returns can carry the key: a profile is
  shown with `has_api_key`. `seed`, `server_kind` and `prices` are taken and shown as stored.
  `prices` (money per million prompt and completion tokens) are what the budget charges each
  call: LiteLLM's own cost map prices a local or custom model at 0, so without them a cost cap
  never binds. A price is a finite number from 0 to `MAX_PRICE_PER_MTOK`, as JSON (a string,
  a bool, NaN or infinity is refused with a 422 naming the field and the value).
- `PATCH /api/v1/runtime/llm-profiles/{name}`: change fields or rotate the key (a new sealed
  value under the same name, then the profile compare-and-set on its revision). `prices` is
  merged: a price left out keeps its value.
- `DELETE /api/v1/runtime/llm-profiles/{name}`: the profile and its sealed key.
- `POST /api/v1/runtime/llm-profiles/{name}/test`: the agent's model probe on this profile
  (`agent.test_lm` with `profile`): the agent opens the key, the gateway never sees it.
"""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Request
from nats.js.errors import KeyNotFoundError
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from fleet_events import bus, streams
from fleet_events import llm as lm
from fleet_events.addresses import AddressRefused
from fleet_gateway.auth import CurrentTenant
from fleet_gateway.errors import ApiError, ErrorBody
from fleet_gateway.routes.common import Strict
from fleet_gateway.routes.runtime import PROBE_SLACK_S, LmProbeResult, ask_agent, probe_result
from fleet_mesh import egress, kvscan
from fleet_mesh.runtime_config import LlmConfig, ProfileConflict, ProfileNotFound, StoredProfile
from fleet_mesh.secrets import SecretError, SecretsWriter, public_key_from_env, secret_key

router = APIRouter(prefix="/api/v1/runtime/llm-profiles", tags=["runtime"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 404, 409, 422, 503)
}
MAX_KEY_CHARS = 4096

Price = Annotated[float, Field(ge=0, le=lm.MAX_PRICE_PER_MTOK, allow_inf_nan=False, strict=True)]
"""Per million tokens; strict: "1.5" or true is a mistake to say, not a number to guess."""


class PricesIn(BaseModel):
    """Money per million tokens, in the tenant's budget currency; a price left out is 0."""

    model_config = ConfigDict(extra="forbid")  # a misspelt price must not be a silent 0

    input_per_mtok: Price = 0.0
    output_per_mtok: Price = 0.0


class PricesPatch(BaseModel):
    """The prices to change; one left out keeps its value."""

    model_config = ConfigDict(extra="forbid")

    input_per_mtok: Price | None = None
    output_per_mtok: Price | None = None


class Prices(BaseModel):
    input_per_mtok: float
    output_per_mtok: float


class ProfileIn(Strict):
    name: str = Field(min_length=1, max_length=64)
    model: str = Field(min_length=1, max_length=200)
    api_base: str | None = Field(default=None, max_length=500)
    api_key: SecretStr | None = Field(default=None, min_length=1, max_length=MAX_KEY_CHARS)
    """SecretStr: a repr or a log line of the body shows '**********', never the key."""
    timeout_s: float = Field(default=60.0, gt=0, le=600)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0, le=2)
    seed: int | None = Field(default=None, ge=0, le=lm.MAX_SEED)
    """Sent with each request, for servers that sample reproducibly with one."""
    server_kind: lm.ServerKind = "generic"
    """`llama.cpp` for llama-cpp-python's server (token limit and output grammar sent its way)."""
    prices: PricesIn = PricesIn()
    """What the budget charges a call of this profile; free (0) unless given."""


class ProfilePatch(Strict):
    model: str | None = Field(default=None, min_length=1, max_length=200)
    api_base: str | None = Field(default=None, max_length=500)
    api_key: SecretStr | None = Field(default=None, min_length=1, max_length=MAX_KEY_CHARS)
    timeout_s: float | None = Field(default=None, gt=0, le=600)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0, le=2)
    seed: int | None = Field(default=None, ge=0, le=lm.MAX_SEED)
    """null clears it."""
    server_kind: lm.ServerKind | None = None
    """Leave it out to keep it; null is refused (a profile always has one)."""
    prices: PricesPatch | None = None
    """Merged into the stored prices; null is refused (0 is free)."""


class Profile(BaseModel):
    name: str
    model: str
    api_base: str | None
    timeout_s: float
    max_tokens: int | None
    temperature: float | None
    seed: int | None
    server_kind: lm.ServerKind
    prices: Prices
    has_api_key: bool
    revision: int


class ProfileList(BaseModel):
    items: list[Profile]


class Deleted(BaseModel):
    name: str
    deleted: bool = True


def _secret_name(profile: str) -> str:
    return f"llm-{profile}"


def _shown(stored: StoredProfile) -> Profile:
    p = stored.profile
    return Profile(
        name=p.name, model=p.model, api_base=p.api_base, timeout_s=p.timeout_s,
        max_tokens=p.max_tokens, temperature=p.temperature, seed=p.seed,
        server_kind=p.server_kind,
        prices=Prices(
            input_per_mtok=p.prices.input_per_mtok, output_per_mtok=p.prices.output_per_mtok
        ),
        has_api_key=p.secret is not None, revision=stored.revision,
    )  # fmt: skip


def _not_found(name: str) -> ApiError:
    return ApiError(
        404, "llm_profile_not_found",
        f"no LLM profile {name[:64]!r} in your tenant: list them with "
        "GET /api/v1/runtime/llm-profiles",
        details={"profile": name[:64]},
    )  # fmt: skip


def _invalid(exc: Exception) -> ApiError:
    return ApiError(422, "invalid_llm_profile", str(exc)[:400])


async def _stores(request: Request) -> tuple[LlmConfig, Any]:
    nc = request.app.state.gateway.nc
    if nc is None or not nc.is_connected:
        raise ApiError(503, "nats_unavailable", "the gateway has no bus connection; retry shortly")
    return await LlmConfig.open(nc.jetstream()), nc.jetstream()


async def _writer(js: Any) -> SecretsWriter:
    key = public_key_from_env()
    if key is None:
        raise ApiError(
            503, "secrets_unconfigured",
            "this gateway cannot store API keys: set FLEET_SECRETS_PUBLIC_KEY to the services' "
            "public key file (or create the profile without api_key)",
        )  # fmt: skip
    return await SecretsWriter.open(js, key)


async def _public(profile: lm.LlmProfile) -> None:
    """A tenant's profile reaches public addresses only (`fleet_events.addresses`), checked
    after DNS resolution, before anything is sealed or stored."""
    if profile.api_base is None:
        return  # the provider's own default address
    try:
        await egress.acheck(profile.api_base)
    except AddressRefused as exc:
        raise ApiError(422, "address_not_public", str(exc), details={"field": "api_base"}) from None


async def _put(
    config: LlmConfig, profile: lm.LlmProfile, tenant: str, expect: int
) -> StoredProfile:
    try:
        revision = await config.put_profile(profile, tenant=tenant, expect=expect)
    except lm.InvalidProfile as exc:
        raise _invalid(exc) from None
    except ProfileConflict as exc:
        raise ApiError(409, "llm_profile_conflict", str(exc)) from None
    return StoredProfile(profile, tenant, revision)


async def _get(config: LlmConfig, name: str, tenant: str) -> StoredProfile:
    try:
        found = await config.get_profile(name, tenant=tenant)
    except lm.InvalidProfile as exc:
        raise _invalid(exc) from None
    if found is None:
        raise _not_found(name)
    return found


async def _seal(js: Any, profile: str, api_key: SecretStr, tenant: str) -> str:
    writer = await _writer(js)
    name = _secret_name(profile)
    try:
        await writer.put(name, api_key.get_secret_value(), tenant=tenant)
    except SecretError as exc:  # its message names the secret, never the value
        raise ApiError(422, "invalid_api_key", str(exc)) from None
    return name


@router.get("", response_model=ProfileList, responses=ERRORS)
async def list_profiles(tenant: CurrentTenant, request: Request) -> ProfileList:
    config, js = await _stores(request)
    prefix = lm.profile_key("x", tenant)[: -len("x")]
    # the tenant's profile keys only, filtered on the server (nats-py's `keys()` walks the whole
    # bucket, and its watch marker can end a listing early under load: `fleet_mesh.kvscan`)
    keys = [entry.key for entry in await kvscan.latest(js, streams.CONFIG.bucket, prefix + ">")]
    items = []
    for key in sorted(keys):
        found = await config.get_profile(key[len(prefix) :], tenant=tenant)
        if found is not None:
            items.append(_shown(found))
    return ProfileList(items=items)


@router.get("/{name}", response_model=Profile, responses=ERRORS)
async def get_profile(name: str, tenant: CurrentTenant, request: Request) -> Profile:
    config, _ = await _stores(request)
    return _shown(await _get(config, name, tenant))


@router.post("", response_model=Profile, status_code=201, responses=ERRORS)
async def create_profile(
    body: Annotated[ProfileIn, Body()], tenant: CurrentTenant, request: Request
) -> Profile:
    config, js = await _stores(request)
    try:
        lm.check_profile_name(body.name)
        draft = lm.LlmProfile(
            name=body.name, model=body.model, api_base=body.api_base, timeout_s=body.timeout_s,
            max_tokens=body.max_tokens, temperature=body.temperature, seed=body.seed,
            server_kind=body.server_kind, prices=lm.Prices(**body.prices.model_dump()),
        )  # fmt: skip
        lm.check_profile(draft)
    except lm.InvalidProfile as exc:
        raise _invalid(exc) from None  # before the key is sealed: a refusal stores nothing
    await _public(draft)
    if await config.get_profile(body.name, tenant=tenant) is not None:
        raise ApiError(
            409, "llm_profile_exists",
            f"LLM profile {body.name!r} exists in your tenant: PATCH it, or pick another name",
        )  # fmt: skip
    secret = None if body.api_key is None else await _seal(js, body.name, body.api_key, tenant)
    profile = lm.LlmProfile(**{**_fields(draft), "secret": secret})
    return _shown(await _put(config, profile, tenant, expect=0))


def _patched_prices(stored: lm.Prices, patch: PricesPatch | None) -> lm.Prices:
    """The stored prices with the patch's over them. A null is refused, not read as 0: free
    is said with 0, and a null that zeroes a price would lift every cost cap on it."""
    if patch is None:
        raise _null_price("prices")
    given = patch.model_dump(exclude_unset=True)
    for name, value in given.items():
        if value is None:
            raise _null_price(f"prices.{name}")
    return lm.Prices(**{**_fields(stored), **given})


def _null_price(field: str) -> ApiError:
    return ApiError(
        422, "invalid_request",
        f"body field {field!r} cannot be null: give a price per million tokens from 0 to "
        f"{lm.MAX_PRICE_PER_MTOK:g} (0 is free), or leave it out to keep the stored one",
        details={"field": field},
    )  # fmt: skip


def _fields(profile: lm.LlmProfile | lm.Prices) -> dict[str, Any]:
    return {f: getattr(profile, f) for f in profile.__struct_fields__}


@router.patch("/{name}", response_model=Profile, responses=ERRORS)
async def patch_profile(
    name: str, body: Annotated[ProfilePatch, Body()], tenant: CurrentTenant, request: Request
) -> Profile:
    config, js = await _stores(request)
    stored = await _get(config, name, tenant)
    changes = body.model_dump(exclude_unset=True, exclude={"api_key", "prices"})
    if "prices" in body.model_fields_set:
        changes["prices"] = _patched_prices(stored.profile.prices, body.prices)
    try:
        updated = lm.LlmProfile(**{**_fields(stored.profile), **changes})
        lm.check_profile(updated)
    except (lm.InvalidProfile, TypeError) as exc:
        raise _invalid(exc) from None
    await _public(updated)
    if body.api_key is not None:  # rotation: the new sealed value, then the profile points at it
        secret = await _seal(js, name, body.api_key, tenant)
        updated = lm.LlmProfile(**{**_fields(updated), "secret": secret})
    return _shown(await _put(config, updated, tenant, expect=stored.revision))


@router.delete("/{name}", response_model=Deleted, responses=ERRORS)
async def delete_profile(name: str, tenant: CurrentTenant, request: Request) -> Deleted:
    config, js = await _stores(request)
    stored = await _get(config, name, tenant)
    kv = await js.key_value(streams.CONFIG.bucket)
    await kv.delete(lm.profile_key(name, tenant))
    if stored.profile.secret is not None:
        secrets = await js.key_value(streams.SECRETS.bucket)
        await secrets.delete(secret_key(stored.profile.secret, tenant))
    return Deleted(name=name)


class ProfileProbe(Strict):
    timeout_s: float = Field(default=20.0, gt=0, le=120)


@router.post("/{name}/test", response_model=LmProbeResult, responses=ERRORS)
async def probe_profile(
    name: str,
    tenant: CurrentTenant,
    request: Request,
    probe: Annotated[ProfileProbe | None, Body()] = None,
) -> LmProbeResult:
    """404 unless the tenant has this profile (a global one is the operator's to test)."""
    config, _ = await _stores(request)
    await _get(config, name, tenant)
    ask = probe or ProfileProbe()
    req = lm.TestLm(tenant=tenant, role="planner", profile=name, timeout_s=ask.timeout_s)
    got: lm.TestLmResult = await ask_agent(request, bus.TEST_LM, req, ask.timeout_s + PROBE_SLACK_S)
    return probe_result(got)


# -- roles: which profile each part of a turn uses ---------------------------------------------

roles_router = APIRouter(prefix="/api/v1/runtime/llm-roles", tags=["runtime"])
RoleName = Literal["planner", "delegate", "delegate_small", "reflection"]


class RoleBinding(BaseModel):
    role: str
    profile: str | None
    scope: Literal["tenant", "global", "unbound"]


class RoleBindings(BaseModel):
    items: list[RoleBinding]


class RolesPatch(Strict):
    roles: dict[RoleName, str] = Field(min_length=1)


async def _bindings(config: LlmConfig, js: Any, tenant: str) -> RoleBindings:
    kv = await js.key_value(streams.CONFIG.bucket)
    items = []
    for role in lm.ROLES:
        profile = await config.role(role, tenant=tenant)  # the tenant's binding, else global
        try:
            own = bool((await kv.get(lm.role_key(role, tenant))).value)
        except KeyNotFoundError:
            own = False
        scope: Literal["tenant", "global", "unbound"] = (
            "tenant" if own else "global" if profile is not None else "unbound"
        )
        items.append(RoleBinding(role=role, profile=profile, scope=scope))
    return RoleBindings(items=items)


@roles_router.get("", response_model=RoleBindings, responses=ERRORS)
async def get_roles(tenant: CurrentTenant, request: Request) -> RoleBindings:
    config, js = await _stores(request)
    return await _bindings(config, js, tenant)


@roles_router.patch("", response_model=RoleBindings, responses=ERRORS)
async def patch_roles(
    body: Annotated[RolesPatch, Body()], tenant: CurrentTenant, request: Request
) -> RoleBindings:
    config, js = await _stores(request)
    for role, profile in body.roles.items():  # every name checked before any binding is written
        try:
            await config.find_profile(profile, tenant=tenant)
        except (lm.InvalidProfile, ProfileNotFound) as exc:
            raise ApiError(
                422, "invalid_llm_role",
                f"role {role!r} cannot use profile {profile[:64]!r}: {str(exc)[:300]}",
                details={"role": role, "profile": profile[:64]},
            ) from None  # fmt: skip
    for role, profile in body.roles.items():
        await config.set_role(role, profile, tenant=tenant)
    return await _bindings(config, js, tenant)
