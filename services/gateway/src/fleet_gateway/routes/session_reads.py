"""What the `/api/v1/sessions*` routes share: the path and query parameters, the error table,
the handles a route needs, and the read side's rule that a client reads its own writes on any
replica (`min_seq`: wait, bounded, until this replica has folded that far)."""

from typing import Annotated, Any

from fastapi import Path, Query, Request
from pydantic import BaseModel

from fleet_events import streams
from fleet_gateway.components import ready
from fleet_gateway.errors import ApiError, ErrorBody, not_found
from fleet_gateway.projections import ProjectionStore
from fleet_gateway.projections.store import decode_cursor
from fleet_gateway.sessionlog import log_head
from fleet_gateway.sessions.commands import SessionCommands
from fleet_mesh.store import EventStore

ID = r"^[A-Za-z0-9_-]{1,64}$"
MAX_SEQ = 2**53
PREFIX = "/api/v1/sessions"

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in (
        (401, "no token, or a token refused"),
        (404, "no such session (or turn) in your tenant"),
        (409, "the session is deleted, or has no running turn to cancel"),
        (413, "the request body is over the limit"),
        (422, "a field is invalid (or min_seq is past the log): the body says which and why"),
        (429, "the tenant is over its request rate or its concurrent turns"),
        (503, "this replica has not folded the log up to min_seq yet, or the log is busy"),
    )
}

SessionId = Annotated[str, Path(pattern=ID, description="a session id: 1-64 of A-Z a-z 0-9 _ -")]
MinSeq = Annotated[
    int,
    Query(
        ge=0,
        le=MAX_SEQ,
        description="answer only once this replica has folded the log up to this stream "
        "sequence (the `seq` a write returned); waits a few seconds at most",
    ),
]


class Written(BaseModel):
    seq: int
    """The stream sequence of the stored event: pass it as `min_seq` to read this write."""


def parts(request: Request) -> tuple[EventStore, ProjectionStore, float]:
    state = request.app.state.gateway
    _, store, projections = ready(state)
    return store, projections, state.settings.read_wait_max_s


def commands(request: Request) -> SessionCommands:
    """This replica's session commands (one set per replica: it holds the keys in flight)."""
    state = request.app.state.gateway
    ready(state)
    found: SessionCommands | None = state.commands
    if found is None:
        raise ApiError(
            503, "not_ready",
            "the gateway is waiting for the mesh's streams and buckets; see GET /ready",
            headers={"Retry-After": "1"},
        )  # fmt: skip
    return found


async def caught_up(request: Request, seq: int) -> None:
    """Wait (bounded) until this replica has folded the log up to `seq`. A `seq` past the
    log's end was never returned by a write: that is the client's error (422), not a wait."""
    _, projections, wait_s = parts(request)
    if projections.checkpoint >= seq:
        return
    nc = request.app.state.gateway.nc
    info = await nc.jetstream().stream_info(streams.SESSIONS.name)
    if seq > info.state.last_seq:
        raise ApiError(
            422,
            "min_seq_ahead",
            f"min_seq {seq} is past the log's last sequence {info.state.last_seq}: pass the "
            "`seq` a write answered with",
            details={"field": "min_seq", "min_seq": seq, "last_seq": info.state.last_seq},
        )
    if not await projections.wait_for(seq, wait_s):
        raise ApiError(
            503,
            "projection_behind",
            f"this replica has folded the log up to {projections.checkpoint}, not yet to "
            f"min_seq {seq}, after {wait_s}s; retry (any replica may answer)",
            details={"min_seq": seq, "at_seq": projections.checkpoint},
            headers={"Retry-After": "1"},
        )


async def session_row(request: Request, tenant: str, session: str, min_seq: int) -> dict[str, Any]:
    """The session's row once folded to `min_seq`; a row not there yet while the log has the
    session (created on another replica a moment ago) is waited for up to the log's head."""
    store, projections, _ = parts(request)
    await caught_up(request, min_seq)
    row = projections.session(tenant, session)
    if row is None:
        head = await log_head(store, tenant, session)  # not found when the log has none either
        await caught_up(request, head.seq)
        row = projections.session(tenant, session)
        if row is None:
            raise not_found("session", session)
    return row


def cursor_value(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    value = decode_cursor(cursor)
    if value is None:
        raise ApiError(
            422,
            "invalid_cursor",
            f"cursor {cursor[:40]!r} is not one this API gave out: pass the `next_cursor` of "
            "the previous page, or none for the first page",
            details={"field": "cursor"},
        )
    return value
