"""API tokens: long-lived bearer tokens a user issues for programs, revocable on every replica.

A token is `flt.<tenant>.<id>.<secret>`: the tenant and id say where to look, the secret (32
random bytes) is the proof. The gateway's KV bucket holds, under `token.<tenant>.<id>`, only
the secret's SHA-256 beside who the token speaks for (tenant, user, admin), its name and its
expiry: whoever can read the bucket holds no token, and the token itself is shown once, in
the answer that created it.

Every request bearing one reads its entry (one KV get, ~0.3 ms), so a revocation (the entry's
delete) holds on every replica from the next request on: no cache to expire, no list to
spread. The id is public (listing shows it); a token is only as strong as its secret, compared
in constant time.
"""

import hashlib
import hmac
import re
import secrets
import time

import msgspec
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from fleet_events import new_id
from fleet_gateway.auth import Principal
from fleet_gateway.errors import ApiError
from fleet_mesh import kvscan

PREFIX = "flt."
SHAPE = re.compile(r"flt\.([A-Za-z0-9_-]{1,64})\.([A-Za-z0-9_-]{1,64})\.([A-Za-z0-9_-]{43})")
MAX_TOKENS_PER_USER = 100


class StoredToken(msgspec.Struct, frozen=True):
    id: str
    tenant: str
    user: str
    admin: bool
    name: str
    created_at: float
    expires_at: float
    sha256: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _key(tenant: str, token_id: str) -> str:
    return f"token.{tenant}.{token_id}"


def _refused(why: str) -> ApiError:
    return ApiError(
        401,
        "invalid_token",
        f"the API token {why}: issue a new one with POST /api/v1/auth/tokens",
        headers={"WWW-Authenticate": "Bearer"},
    )


def _unavailable(exc: BaseException) -> ApiError:
    return ApiError(
        503,
        "auth_unavailable",
        f"the API token store (the gateway's KV on NATS) did not answer ({type(exc).__name__}); "
        "retry shortly",
        headers={"Retry-After": "1"},
    )


class ApiTokens:
    def __init__(self, js: JetStreamContext, kv: KeyValue, bucket: str) -> None:
        self._js, self._kv, self._bucket = js, kv, bucket

    async def issue(
        self, principal: Principal, *, name: str, ttl_s: float, admin: bool
    ) -> tuple[str, StoredToken]:
        """A new token for `principal` (admin only when asked for and the caller is one):
        (the token, shown once; what is stored)."""
        mine = [t for t in await self.list(principal.tenant) if t.user == principal.user]
        if len(mine) >= MAX_TOKENS_PER_USER:
            raise ApiError(
                409,
                "too_many_tokens",
                f"user {principal.user!r} holds {len(mine)} API tokens, the most one user may "
                "hold: revoke one (DELETE /api/v1/auth/tokens/{id}) first",
                details={"tokens": len(mine), "limit": MAX_TOKENS_PER_USER},
            )
        secret = secrets.token_urlsafe(32)
        now = time.time()
        stored = StoredToken(
            id=new_id(),
            tenant=principal.tenant,
            user=principal.user,
            admin=admin,
            name=name,
            created_at=now,
            expires_at=now + ttl_s,
            sha256=_digest(secret),
        )
        await self._kv.create(_key(stored.tenant, stored.id), msgspec.json.encode(stored))
        return f"{PREFIX}{stored.tenant}.{stored.id}.{secret}", stored

    async def _get(self, tenant: str, token_id: str) -> StoredToken | None:
        try:
            entry = await self._kv.get(_key(tenant, token_id))
        except KeyNotFoundError:  # never issued, or revoked
            return None
        except (NatsError, TimeoutError) as exc:
            raise _unavailable(exc) from exc
        return msgspec.json.decode(entry.value or b"", type=StoredToken)

    async def verify(self, token: str) -> Principal:
        match = SHAPE.fullmatch(token)
        if match is None:
            raise _refused("is malformed (flt.<tenant>.<id>.<43 characters> expected)")
        tenant, token_id, secret = match.groups()
        stored = await self._get(tenant, token_id)
        if stored is None or not hmac.compare_digest(stored.sha256, _digest(secret)):
            raise _refused(f"{token_id!r} is unknown or revoked")
        if stored.expires_at < time.time():
            raise _refused(f"{token_id!r} has expired")
        return Principal(
            tenant=stored.tenant, user=stored.user, admin=stored.admin, token_id=stored.id
        )

    async def alive(self, tenant: str, token_id: str) -> bool:
        """Is the token still issued and unexpired (a ticket it minted may still open)?"""
        stored = await self._get(tenant, token_id)
        return stored is not None and stored.expires_at >= time.time()

    async def revoked(self, tenant: str, token_id: str) -> None:
        """Return once the token is revoked (its entry deleted or purged) or gone: what an
        open socket opened with it waits on, on every replica (a KV watch, no polling)."""
        watcher = await self._kv.watch(_key(tenant, token_id))
        try:
            if not await self.alive(tenant, token_id):  # revoked before the watch began
                return
            while True:
                entry = await watcher.updates(timeout=None)  # type: ignore[no-untyped-call]
                if entry is not None and entry.operation in ("DEL", "PURGE"):
                    return
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]

    async def list(self, tenant: str) -> list[StoredToken]:
        """The tenant's live tokens, oldest first (read on the server's side of the filter:
        `kv.keys` filters on the client after reading every key, and nats-py's watch marker can
        end a listing before its first key under load: `fleet_mesh.kvscan`)."""
        entries = await kvscan.latest(self._js, self._bucket, f"token.{tenant}.*")
        found = [msgspec.json.decode(e.value, type=StoredToken) for e in entries if e.value]
        return sorted(found, key=lambda t: (t.created_at, t.id))

    async def revoke(self, principal: Principal, token_id: str) -> StoredToken | None:
        """Delete the token: only its user or an admin of its tenant may; anything else
        (another tenant's, another user's, none at all) is None, which the route answers
        as 404."""
        stored = await self._get(principal.tenant, token_id)
        if stored is None or not (stored.user == principal.user or principal.admin):
            return None
        await self._kv.purge(_key(principal.tenant, token_id))
        return stored
