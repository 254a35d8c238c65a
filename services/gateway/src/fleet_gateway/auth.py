"""Who is asking: a `Principal` (tenant, user, admin) from the request's bearer token, and
nothing else. No route reads a tenant or a user from a query, a path or a body.

Three kinds of token are accepted, each with its own keys, so one can never pass for another:

- **API tokens** (`flt.<tenant>.<id>.<secret>`, `fleet_gateway.api_tokens`): a random secret
  whose SHA-256 the gateway's KV holds, looked up on every request so a revocation holds on
  every replica at once.
- **Gateway tokens** (the development token `fleet up` prints): HS256 JWTs
  signed with a secret generated on first run in the data dir (`dev_token(data_dir)`), issuer
  `fleet-gateway`. Only HS256 is tried with that secret, so an RS256 public key can never be
  used as an HMAC secret (the classic algorithm confusion).
- **OIDC tokens**: RS256 / ES256 JWTs from the configured issuer, checked against its JWKS for
  issuer, audience, expiry and signature. An unknown `kid` refetches the JWKS (the issuer
  rotated its keys), at most once per `jwks_refetch_min_s`.
"""

import asyncio
import time
from typing import Annotated, Any, Protocol

import httpx
import jwt
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict

from fleet_events.ids import InvalidId, check_id
from fleet_gateway.config import GatewaySettings
from fleet_gateway.errors import ApiError
from fleet_gateway.quotas import RateLimiter
from fleet_mesh.tokens import (
    GATEWAY_AUDIENCE,
    GATEWAY_ISSUER,
    signing_secret,
)

ASYMMETRIC = ("RS256", "RS384", "RS512", "ES256", "ES384", "PS256")
MAX_TOKEN_CHARS = 8192


class Principal(BaseModel):
    """The caller, as its token says: every route is scoped to `tenant`."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    user: str
    admin: bool = False
    token_id: str | None = None
    """The API token the caller presented (None: a gateway or OIDC token): a ticket it mints
    and a socket it opens end when the token is revoked."""


def _unauthorized(code: str, message: str) -> ApiError:
    return ApiError(401, code, message, headers={"WWW-Authenticate": "Bearer"})


class JwksVerifier:
    """OIDC tokens against the issuer's published keys, refetched when a token names a key
    the cached set does not hold (rotation), but never more often than `refetch_min_s`."""

    def __init__(
        self, *, issuer: str, audience: str, jwks_url: str, refetch_min_s: float = 10.0
    ) -> None:
        self.issuer = issuer
        self.audience = audience
        self.jwks_url = jwks_url or issuer.rstrip("/") + "/.well-known/jwks.json"
        self.refetch_min_s = refetch_min_s
        self.fetches = 0
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def _fetch(self) -> None:
        self.fetches += 1
        self._fetched_at = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=5.0, follow_redirects=False) as client:
                response = await client.get(self.jwks_url)
            response.raise_for_status()
            keys = jwt.PyJWKSet.from_dict(response.json()).keys
        except (httpx.HTTPError, ValueError, jwt.PyJWKSetError) as exc:
            raise ApiError(
                503,
                "auth_unavailable",
                f"the issuer's keys could not be read from {self.jwks_url} "
                f"({type(exc).__name__}); retry shortly",
                headers={"Retry-After": "5"},
            ) from exc
        self._keys = {key.key_id or "": key for key in keys}

    async def _key(self, kid: str) -> jwt.PyJWK | None:
        async with self._lock:
            if kid in self._keys:
                return self._keys[kid]
            stale = (
                self._fetched_at is None
                or time.monotonic() - self._fetched_at >= self.refetch_min_s
            )
            if stale:
                await self._fetch()
            return self._keys.get(kid)

    async def verify(self, token: str, header: dict[str, Any]) -> dict[str, Any]:
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise _unauthorized("invalid_token", "the token's header names no key id (kid)")
        key = await self._key(kid)
        if key is None:
            raise _unauthorized(
                "invalid_token",
                f"the token is signed with key {kid[:64]!r}, which the issuer does not publish",
            )
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=list(ASYMMETRIC),
                audience=self.audience,
                issuer=self.issuer,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise _unauthorized("invalid_token", f"the token was refused: {exc}") from exc
        return claims


API_TOKEN_PREFIX = "flt."  # noqa: S105 - the shape of an API token, not a secret


class TokenStore(Protocol):
    """API tokens (`fleet_gateway.api_tokens.ApiTokens`), looked up on every request."""

    async def verify(self, token: str) -> "Principal": ...


class Authenticator:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.api_tokens: TokenStore | None = None
        """Set once the gateway's KV bucket is open (`components`)."""
        # The door meters what it admits: every authenticated request costs its tenant a token.
        self.rate = RateLimiter(settings.tenant_rps, settings.tenant_burst)
        self._secret = signing_secret(settings.data_dir) if settings.data_dir else None
        self.oidc = (
            JwksVerifier(
                issuer=settings.oidc_issuer,
                audience=settings.oidc_audience,
                jwks_url=settings.oidc_jwks_url,
                refetch_min_s=settings.jwks_refetch_min_s,
            )
            if settings.oidc_issuer
            else None
        )

    def _gateway_claims(self, token: str) -> dict[str, Any]:
        assert self._secret is not None
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._secret,
                algorithms=["HS256"],
                audience=GATEWAY_AUDIENCE,
                issuer=GATEWAY_ISSUER,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise _unauthorized("invalid_token", f"the token was refused: {exc}") from exc
        return claims

    async def authenticate(self, token: str) -> Principal:
        if self._secret is None and self.oidc is None:
            raise _unauthorized(
                "auth_not_configured",
                "this gateway accepts no tokens: set FLEET_GATEWAY_DATA_DIR (gateway tokens) "
                "or FLEET_GATEWAY_OIDC_ISSUER (OIDC)",
            )
        if len(token) > MAX_TOKEN_CHARS:
            raise _unauthorized("invalid_token", f"the token is over {MAX_TOKEN_CHARS} characters")
        if token.startswith(API_TOKEN_PREFIX):
            if self.api_tokens is None:
                raise ApiError(
                    503,
                    "not_ready",
                    "the gateway is waiting for the mesh's buckets, where API tokens live; "
                    "retry shortly (see GET /ready)",
                    headers={"Retry-After": "1"},
                )
            return await self.api_tokens.verify(token)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise _unauthorized(
                "invalid_token", "the bearer token is not a JWT (three base64url parts)"
            ) from exc
        alg = header.get("alg")
        if alg == "HS256" and self._secret is not None:
            claims = self._gateway_claims(token)
            tenant_claim, user_claim, admin_claim = "tid", "sub", "fleet_admin"
        elif alg in ASYMMETRIC and self.oidc is not None:
            claims = await self.oidc.verify(token, header)
            s = self.settings
            tenant_claim, user_claim, admin_claim = s.tenant_claim, s.user_claim, s.admin_claim
        else:
            raise _unauthorized(
                "invalid_token", f"tokens signed with {str(alg)[:16]!r} are not accepted here"
            )
        return principal_of(claims, tenant_claim, user_claim, admin_claim)


def principal_of(
    claims: dict[str, Any], tenant_claim: str, user_claim: str, admin: str
) -> Principal:
    tenant = claims.get(tenant_claim)
    user = claims.get(user_claim)
    if not isinstance(tenant, str):
        raise _unauthorized(
            "invalid_token", f"the token carries no tenant (claim {tenant_claim!r})"
        )
    try:
        check_id("tenant", tenant)
    except InvalidId as exc:
        raise _unauthorized("invalid_token", f"the token's tenant is not usable: {exc}") from exc
    if not isinstance(user, str) or not 0 < len(user) <= 256:
        raise _unauthorized("invalid_token", f"the token carries no user (claim {user_claim!r})")
    return Principal(tenant=tenant, user=user, admin=claims.get(admin) is True)


bearer = HTTPBearer(auto_error=False, description="a gateway token or an OIDC access token")


async def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The FastAPI dependency every /api route takes: the caller, or 401 (429 when its
    tenant is over its request rate)."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized(
            "auth_required",
            "send 'Authorization: Bearer <token>' (fleet up prints a development token)",
        )
    authenticator: Authenticator = request.app.state.gateway.auth
    principal = await authenticator.authenticate(credentials.credentials)
    authenticator.rate.charge(principal.tenant)  # 429 rate_limited over the tenant's rate
    return principal


async def current_tenant(principal: Annotated[Principal, Depends(current_principal)]) -> str:
    return principal.tenant


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
CurrentTenant = Annotated[str, Depends(current_tenant)]
