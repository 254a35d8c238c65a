"""Writing to a session's log on a client's behalf: the only way the gateway changes anything.

The tenant is always the caller's (from `Principal`), the actor is this replica, and the
answer is the stream sequence the event was stored at, which a later read on any replica
passes as `min_seq` to see its own write.
"""

from typing import Any

from fleet_events import Actor, Envelope
from fleet_events.envelope import Event, new_id, utc_now
from fleet_events.session import log_subject
from fleet_gateway.errors import ApiError, not_found
from fleet_mesh.store import EMPTY, AppendConflict, EventStore, Head

CONFLICT_TRIES = 5


async def log_head(store: EventStore, tenant: str, session: str) -> Head:
    """The session log's head, or 404 when the tenant has no such session (the log, not a
    projection, decides: a session created on another replica a moment ago exists here)."""
    head = await store.head(log_subject(tenant, session))
    if head == EMPTY or head.seq == 0:
        raise not_found("session", session)
    return head


async def append_to_log(
    store: EventStore,
    actor: Actor,
    tenant: str,
    session: str,
    data: Event,
    *,
    turn: str | None = None,
    new_session: bool = False,
    **envelope: Any,
) -> tuple[int, Envelope[Any]]:
    """Append `data` to the session's `.log`; returns (stream sequence, envelope).

    `new_session`: the log must not exist yet (create). Otherwise it must (404 if not), and
    the event goes after whatever head it has: a race with another writer is retried, as the
    event's place after the other one changes nothing it means.
    """
    subject = log_subject(tenant, session)
    env: Envelope[Any] = Envelope(
        id=new_id(),
        tenant=tenant,
        actor=actor,
        ts=utc_now(),
        data=data,
        session=session,
        turn=turn,
        **envelope,
    )
    for _ in range(CONFLICT_TRIES):
        expect = EMPTY if new_session else await log_head(store, tenant, session)
        try:
            appended = await store.append(subject, env, expect=expect)
        except AppendConflict:
            if new_session:
                raise ApiError(
                    409, "session_exists", f"session {session!r} exists already"
                ) from None
            continue
        return appended.seq, env
    raise ApiError(
        503,
        "log_busy",
        f"session {session!r} kept changing under this write ({CONFLICT_TRIES} tries); retry",
        headers={"Retry-After": "1"},
    )
