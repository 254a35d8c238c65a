"""WebSocket tickets: short-lived, single-use, redeemable on any gateway replica.

Browsers cannot set headers on a WebSocket, so a client trades its bearer token for a ticket
(`POST /api/v1/auth/ws-ticket`) and opens the socket with `?ticket=`. A ticket lives in the
`fleet-tickets` KV bucket (entries expire with the bucket's TTL), not in process memory, so the
socket may land on any replica. Single use is atomic across replicas: redeeming deletes the
entry *at the revision it read* (`delete(key, last=revision)`), and of two replicas racing with
the same ticket exactly one delete succeeds. The bucket is keyed by the ticket's SHA-256, so
whoever can read the bucket still holds no ticket.
"""

import hashlib
import re
import secrets
import time

import msgspec
from nats.js.errors import APIError, KeyNotFoundError
from nats.js.kv import KeyValue
from starlette.requests import HTTPConnection

from fleet_gateway.auth import Principal
from fleet_gateway.errors import ApiError

TICKET_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")


class _Stored(msgspec.Struct, frozen=True):
    tenant: str
    user: str
    admin: bool
    expires_at: float
    token_id: str | None = None
    """The API token that minted the ticket: redeemed only while that token lives."""


def _key(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()


def _refused(why: str) -> ApiError:
    return ApiError(
        401,
        "invalid_ticket",
        f"the ticket {why}: fetch a new one with POST /api/v1/auth/ws-ticket for each connection",
    )


class Tickets:
    def __init__(self, kv: KeyValue, ttl_s: float) -> None:
        self._kv = kv
        self.ttl_s = ttl_s

    async def mint(self, principal: Principal) -> tuple[str, float]:
        ticket = secrets.token_urlsafe(32)
        expires_at = time.time() + self.ttl_s
        stored = _Stored(
            principal.tenant, principal.user, principal.admin, expires_at, principal.token_id
        )
        await self._kv.create(_key(ticket), msgspec.json.encode(stored))
        return ticket, expires_at

    async def redeem(self, ticket: str) -> Principal:
        if not TICKET_SHAPE.fullmatch(ticket):
            raise _refused("is malformed (43 URL-safe base64 characters expected)")
        key = _key(ticket)
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:  # includes a deleted (used) key
            raise _refused("is unknown, expired or already used") from None
        stored = msgspec.json.decode(entry.value or b"", type=_Stored)
        try:
            await self._kv.delete(key, last=entry.revision)
        except APIError:  # another redemption deleted it first
            raise _refused("is unknown, expired or already used") from None
        if stored.expires_at < time.time():
            raise _refused("has expired")
        return Principal(
            tenant=stored.tenant, user=stored.user, admin=stored.admin, token_id=stored.token_id
        )


async def redeem_ticket(connection: HTTPConnection, ticket: str) -> Principal:
    """What the WebSocket routes call with the `?ticket=` they were opened with (raises
    `ApiError` 401 `invalid_ticket`)."""
    tickets: Tickets | None = connection.app.state.gateway.tickets
    if tickets is None:
        raise ApiError(
            503,
            "not_ready",
            "the gateway is waiting for the mesh's ticket bucket: retry shortly (GET /ready "
            "names what is missing)",
            headers={"Retry-After": "1"},
        )
    principal = await tickets.redeem(ticket)
    api_tokens = connection.app.state.gateway.api_tokens
    if principal.token_id is not None and (
        api_tokens is None or not await api_tokens.alive(principal.tenant, principal.token_id)
    ):
        raise _refused(
            f"was minted with API token {principal.token_id!r}, since revoked or expired"
        )
    return principal
