"""`/api/v1/auth/*`: who the token says you are, and a WebSocket ticket for that identity."""

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from fleet_gateway.auth import CurrentPrincipal, Principal
from fleet_gateway.components import ready
from fleet_gateway.errors import ErrorBody

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
