"""`/api/v1/auth/*`: who the token says you are, a WebSocket ticket for that identity, and
API tokens (issue, list, revoke).

Only a signed-in user (a gateway or OIDC token) issues API tokens: a request bearing an API
token is refused (403 `login_required`), so a leaked API token cannot mint itself successors
that outlive its revocation or its expiry. An API token may still list and revoke its user's
tokens (revoking is how a leak is contained)."""

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field

from fleet_gateway.api_tokens import ApiTokens, StoredToken
from fleet_gateway.auth import API_TOKEN_PREFIX, CurrentPrincipal, Principal, bearer
from fleet_gateway.components import ready
from fleet_gateway.errors import ApiError, ErrorBody

UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "no token, or a token refused"},
    429: {"model": ErrorBody, "description": "the tenant is over its request rate"},
    503: {"model": ErrorBody, "description": "the mesh or the OIDC issuer is not reachable"},
}
router = APIRouter(prefix="/api/v1/auth", tags=["auth"], responses=UNAUTHORIZED)


class Me(BaseModel):
    tenant: str
    user: str
    admin: bool


class WsTicket(BaseModel):
    ticket: str
    expires_at: datetime
    ttl_s: float


@router.get("/me", response_model=Me)
async def me(principal: CurrentPrincipal) -> Me:
    return Me(tenant=principal.tenant, user=principal.user, admin=principal.admin)


@router.post("/ws-ticket", response_model=WsTicket)
async def ws_ticket(request: Request, principal: CurrentPrincipal) -> WsTicket:
    """A single-use ticket for `?ticket=` on the WebSocket routes, valid on any replica."""
    tickets, _, _ = ready(request.app.state.gateway)
    ticket, expires_at = await tickets.mint(Principal.model_validate(principal))
    return WsTicket(
        ticket=ticket,
        expires_at=datetime.fromtimestamp(expires_at, UTC),
        ttl_s=tickets.ttl_s,
    )


class IssueToken(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, description="what the token is for")
    ttl_s: float = Field(
        default=90 * 24 * 3600.0, gt=0, description="seconds it is valid (at most a year)"
    )
    admin: bool = Field(default=False, description="an admin token (only an admin may ask)")


class TokenOut(BaseModel):
    id: str
    name: str
    user: str
    admin: bool
    created_at: datetime
    expires_at: datetime


class IssuedToken(TokenOut):
    token: str
    """The bearer token itself: shown only in this answer, stored only as its SHA-256."""


class TokenList(BaseModel):
    items: list[TokenOut]


def _out(stored: StoredToken) -> dict[str, Any]:
    return {
        "id": stored.id,
        "name": stored.name,
        "user": stored.user,
        "admin": stored.admin,
        "created_at": datetime.fromtimestamp(stored.created_at, UTC),
        "expires_at": datetime.fromtimestamp(stored.expires_at, UTC),
    }


def _tokens(request: Request) -> ApiTokens:
    ready(request.app.state.gateway)
    tokens: ApiTokens | None = request.app.state.gateway.api_tokens
    assert tokens is not None  # opened with the rest (`components._open`)
    return tokens


TOKEN_ERRORS: dict[int | str, dict[str, Any]] = {
    403: {
        "model": ErrorBody,
        "description": "an admin token asked for by a non-admin, or a request bearing an API "
        "token (only a signed-in user issues tokens)",
    },
    404: {"model": ErrorBody, "description": "no such token of yours"},
    409: {"model": ErrorBody, "description": "the user holds the most tokens allowed"},
    422: {"model": ErrorBody, "description": "a field is invalid"},
}


@router.post("/tokens", status_code=201, response_model=IssuedToken, responses=TOKEN_ERRORS)
async def issue_api_token(
    request: Request,
    principal: CurrentPrincipal,
    body: IssueToken,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> IssuedToken:
    """An API token for the caller's tenant and user, for programs (`Authorization: Bearer`).
    The token is in this answer only: the gateway keeps its SHA-256, never the token. The
    caller must be signed in (a gateway or OIDC token): an API token cannot issue tokens."""
    if credentials is not None and credentials.credentials.startswith(API_TOKEN_PREFIX):
        raise ApiError(
            403,
            "login_required",
            "an API token cannot issue API tokens: sign in (a gateway or OIDC token) and "
            "issue it from there; nothing was issued",
        )
    settings = request.app.state.gateway.settings
    if body.ttl_s > settings.api_token_max_ttl_s:
        raise ApiError(
            422,
            "invalid_request",
            f"body field 'ttl_s': {body.ttl_s:g} s is longer than the longest this gateway "
            f"issues ({settings.api_token_max_ttl_s:g} s); ask for less",
            details={"field": "ttl_s", "max": settings.api_token_max_ttl_s},
        )
    if body.admin and not principal.admin:
        raise ApiError(
            403,
            "admin_required",
            "only an admin may issue an admin token: ask without `admin`, or ask an admin",
            details={"field": "admin"},
        )
    token, stored = await _tokens(request).issue(
        principal, name=body.name, ttl_s=body.ttl_s, admin=body.admin
    )
    return IssuedToken(token=token, **_out(stored))


@router.get("/tokens", response_model=TokenList)
async def list_api_tokens(request: Request, principal: CurrentPrincipal) -> TokenList:
    """Your live API tokens (an admin sees every user's of the tenant); never the tokens
    themselves."""
    found = await _tokens(request).list(principal.tenant)
    shown = [t for t in found if principal.admin or t.user == principal.user]
    return TokenList(items=[TokenOut(**_out(t)) for t in shown])


@router.delete("/tokens/{token_id}", response_model=TokenOut, responses=TOKEN_ERRORS)
async def revoke_api_token(
    request: Request,
    principal: CurrentPrincipal,
    token_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")],
) -> TokenOut:
    """Revoke a token: refused on every replica from the next request on. Yours, or any of
    the tenant's for an admin; anyone else's is 404."""
    revoked = await _tokens(request).revoke(principal, token_id)
    if revoked is None:
        raise ApiError(
            404,
            "token_not_found",
            f"no API token {token_id!r} of yours: list them with GET /api/v1/auth/tokens",
            details={"token": token_id},
        )
    return TokenOut(**_out(revoked))
