"""`GET/PATCH /api/v1/runtime/settings`: the runtime settings of the config KV
(`fleet_events.config.SETTINGS`), as the caller's tenant gets them.

A tenant's value wins over the global one, which wins over the built-in default; services read
the bucket at each decision (`fleet_mesh.runtime_config`), so a change reaches every replica
with no restart. Any caller may set or clear its own tenant's values, except those of an
`operator_only` setting (the provider, the warm pool: the deployment's, not a tenant's), which
an admin sets globally (`scope: "global"`) or for a named tenant (`PATCH /runtime/settings/
tenants/{tenant}`, admins only; GET there shows that tenant's view); global values are an
admin's. A refusal is 403 `admin_required` naming the key. Every value is checked before
anything is written: one bad value refuses the whole request, naming the key and what it may
be, and stores nothing. The gateway is the config bucket's only writer: the services reading
it do not check who wrote a value. A setting
whose name says it holds a secret is shown masked (none of today's settings does).
"""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Request
from nats.js.errors import KeyNotFoundError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from fleet_events import streams
from fleet_events.config import SETTINGS, InvalidSetting, Setting, global_key, setting, tenant_key
from fleet_events.ids import ID_PATTERN
from fleet_gateway.auth import CurrentPrincipal, Principal
from fleet_gateway.errors import ApiError, ErrorBody
from fleet_gateway.routes.common import nats

router = APIRouter(prefix="/runtime/settings", tags=["runtime"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 403, 422, 429, 503)
}
MASK = "********"
SECRET_WORDS = ("key", "secret", "token", "password")
MAX_VALUE_CHARS = 500


class SettingOut(BaseModel):
    key: str
    env: str
    description: str
    value: str
    """What the caller's tenant gets now (masked for a secret)."""
    source: Literal["tenant", "global", "default"]
    default: str
    choices: list[str]
    integer: bool
    tenant_value: str | None
    global_value: str | None
    secret: bool
    operator_only: bool
    """Set by an admin only (globally, or for a named tenant), never by the tenant itself."""


class SettingsOut(BaseModel):
    tenant: str
    can_edit_global: bool
    items: list[SettingOut]


class SettingsPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    updates: dict[str, StrictStr | StrictInt | StrictBool | None] = Field(
        min_length=1, max_length=len(SETTINGS) or 1
    )
    """key → new value; null clears the value at `scope` (the next one down applies). Strict
    types: in lax mode `true` would pass as the integer 1 (caught by this module's test)."""
    scope: Literal["tenant", "global"] = "tenant"


class SettingsPatched(SettingsOut):
    scope: Literal["tenant", "global"]
    updated: list[str]


def is_secret(spec: Setting) -> bool:
    return any(word in spec.key.split("_") for word in SECRET_WORDS)


def _shown(raw: str | None, secret: bool) -> str | None:
    return MASK if secret and raw else raw


async def _read(kv: Any, key: str) -> str | None:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return entry.value.decode() if entry.value else None


async def _view(kv: Any, tenant: str, admin: bool) -> SettingsOut:
    items = []
    for spec in SETTINGS:
        own = await _read(kv, tenant_key(tenant, spec.key))
        shared = await _read(kv, global_key(spec.key))
        source: Literal["tenant", "global", "default"] = (
            "tenant" if own is not None else "global" if shared is not None else "default"
        )
        value = own if own is not None else shared if shared is not None else spec.default
        secret = is_secret(spec)
        items.append(
            SettingOut(
                key=spec.key, env=spec.env, description=spec.description,
                value=_shown(value, secret) or "", source=source, default=spec.default,
                choices=list(spec.choices), integer=spec.integer,
                tenant_value=_shown(own, secret), global_value=_shown(shared, secret),
                secret=secret, operator_only=spec.operator_only,
            )
        )  # fmt: skip
    return SettingsOut(tenant=tenant, can_edit_global=admin, items=items)


def _refused(key: str, value: object, problem: str) -> ApiError:
    return ApiError(
        422, "invalid_setting", problem,
        details={"key": key[:64], "value": str(value)[:80]},
    )  # fmt: skip


def _operator_only(key: str, tenant: str) -> ApiError:
    return ApiError(
        403, "admin_required",
        f"{key} is the deployment's choice, set by an admin only, globally or for one tenant: "
        f"ask an admin to set it for tenant {tenant!r} (PATCH "
        f"/api/v1{router.prefix}/tenants/{tenant}, with an admin token); nothing was changed",
        details={"key": key},
    )  # fmt: skip


def _checked(
    updates: dict[str, str | int | bool | None], principal: Principal
) -> dict[str, str | None]:
    """Every value validated before any is written; the first bad one names its key, and an
    operator-only key from a non-admin (even a valid value, or null) refuses the whole
    request."""
    checked: dict[str, str | None] = {}
    for key, raw in updates.items():
        try:
            spec = setting(key)
        except InvalidSetting as exc:
            raise _refused(key, raw, str(exc)) from None
        if spec.operator_only and not principal.admin:
            if raw is not None:
                _value(spec, key, raw)  # a bad value is named as such first
            raise _operator_only(spec.key, principal.tenant)
        checked[key] = None if raw is None else _value(spec, key, raw)
    return checked


def _value(spec: Setting, key: str, raw: str | int | bool) -> str:
    if isinstance(raw, bool):  # a JSON true is not 1
        raise _refused(key, raw, f"{key} takes a string or a number, not {raw!r}")
    value = str(raw).strip()
    if len(value) > MAX_VALUE_CHARS:
        raise _refused(key, value, f"{key} is longer than {MAX_VALUE_CHARS} characters")
    try:
        spec.validate(value)
    except InvalidSetting as exc:
        raise _refused(key, value, str(exc)) from None
    return value


@router.get("", response_model=SettingsOut, responses=ERRORS)
async def get_settings(principal: CurrentPrincipal, request: Request) -> SettingsOut:
    kv = await nats(request).jetstream().key_value(streams.CONFIG.bucket)
    return await _view(kv, principal.tenant, principal.admin)


@router.patch("", response_model=SettingsPatched, responses=ERRORS)
async def patch_settings(
    body: Annotated[SettingsPatch, Body()], principal: CurrentPrincipal, request: Request
) -> SettingsPatched:
    if body.scope == "global" and not principal.admin:
        raise ApiError(
            403, "admin_required",
            "global settings apply to every tenant and are changed by an admin only: send "
            'scope "tenant" to change your tenant\'s value',
        )  # fmt: skip
    return await _write(request, principal, body, principal.tenant)


async def _write(
    request: Request, principal: Principal, body: SettingsPatch, tenant: str
) -> SettingsPatched:
    checked = _checked(body.updates, principal)
    kv = await nats(request).jetstream().key_value(streams.CONFIG.bucket)
    for key, value in checked.items():
        target = global_key(key) if body.scope == "global" else tenant_key(tenant, key)
        if value is None:
            await kv.delete(target)
        else:
            await kv.put(target, value.encode())
    view = await _view(kv, tenant, principal.admin)
    return SettingsPatched(**view.model_dump(), scope=body.scope, updated=sorted(checked))


# -- an admin's view and writes of a named tenant's values -----------------------------------

TenantId = Annotated[str, Path(pattern=f"^{ID_PATTERN.pattern}$")]


class TenantSettingsPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    updates: dict[str, StrictStr | StrictInt | StrictBool | None] = Field(
        min_length=1, max_length=len(SETTINGS) or 1
    )
    """key → the named tenant's new value; null clears it (the global value applies)."""


def _admin_only(principal: Principal) -> None:
    if not principal.admin:
        raise ApiError(
            403, "admin_required",
            "a named tenant's settings are an admin's to read and change: send your own "
            f"tenant's to /api/v1{router.prefix}",
        )  # fmt: skip


@router.get("/tenants/{tenant}", response_model=SettingsOut, responses=ERRORS)
async def get_tenant_settings(
    tenant: TenantId, principal: CurrentPrincipal, request: Request
) -> SettingsOut:
    """What the named tenant gets (admins only)."""
    _admin_only(principal)
    kv = await nats(request).jetstream().key_value(streams.CONFIG.bucket)
    return await _view(kv, tenant, principal.admin)


@router.patch("/tenants/{tenant}", response_model=SettingsPatched, responses=ERRORS)
async def patch_tenant_settings(
    tenant: TenantId,
    body: Annotated[TenantSettingsPatch, Body()],
    principal: CurrentPrincipal,
    request: Request,
) -> SettingsPatched:
    """Set or clear the named tenant's values, operator-only ones included (admins only):
    how a tenant is put on a provider."""
    _admin_only(principal)
    patch = SettingsPatch(updates=body.updates, scope="tenant")
    return await _write(request, principal, patch, tenant)
