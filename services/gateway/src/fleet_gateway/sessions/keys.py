"""A turn request's idempotency key: checked where it enters, then hashed with the tenant and
the session into the event id (and the turn id), so the client's string is never a stream-wide
message id and another tenant's, or another session's, same key is another request."""

import hashlib

from fleet_gateway.sessions.errors import InvalidKey

MAX_KEY_CHARS = 255


def check_key(value: str, where: str) -> str:
    """`value` as a key, or `InvalidKey` naming `where` (the header or field it came in)."""
    if not value:
        raise InvalidKey(where, "is empty")
    if len(value) > MAX_KEY_CHARS:
        raise InvalidKey(where, f"is {len(value)} characters, over {MAX_KEY_CHARS}")
    bad = next((c for c in value if not " " <= c <= "~"), None)
    if bad is not None:
        raise InvalidKey(where, f"holds {bad!r}, which is not printable ASCII")
    return value


def _hashed(kind: str, tenant: str, session: str, key: str) -> str:
    joined = "\x00".join((kind, tenant, session, key)).encode()
    return hashlib.sha256(joined).hexdigest()


def key_event_id(tenant: str, session: str, key: str) -> str:
    """The event id of the turn request made under `key` in (tenant, session)."""
    return _hashed("event", tenant, session, key)


def key_turn_id(tenant: str, session: str, key: str) -> str:
    """Its turn id: the same on every try, so two replicas racing one key write one turn."""
    return _hashed("turn", tenant, session, key)[:32]
