"""`/api/v1/sessions`: create, list, read, rename and delete sessions.

Writes are the session commands (`fleet_gateway.sessions.commands`, which the WebSocket frames
call too) and answer with the stream sequence of the stored event; reads answer from this
replica's read models and accept `min_seq` (`session_reads`), so a client reads its own writes
on any replica. Every route is scoped to the caller's tenant: another tenant's session answers
exactly like an unknown one (404). Turns, state and purge have modules of their own.
"""

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from fleet_gateway.auth import CurrentPrincipal
from fleet_gateway.errors import ApiError
from fleet_gateway.projections import ProjectionStore
from fleet_gateway.projections.fold import stamp
from fleet_gateway.projections.store import encode_cursor
from fleet_gateway.routes.common import Strict
from fleet_gateway.routes.session_reads import (
    ERRORS,
    PREFIX,
    MinSeq,
    SessionId,
    Written,
    caught_up,
    commands,
    cursor_value,
    parts,
    session_row,
)

router = APIRouter(prefix=PREFIX, tags=["sessions"], responses=ERRORS)


class CreateSession(Strict):
    title: str = Field(default="", max_length=200)


class PatchSession(Strict):
    title: str = Field(max_length=200)


class SessionOut(BaseModel):
    id: str
    title: str
    owner: str
    status: Literal["active", "deleted"]
    created_at: str
    updated_at: str
    turn_count: int
    active_turn: str | None
    created_seq: int
    last_seq: int


class SessionPage(BaseModel):
    items: list[SessionOut]
    next_cursor: str | None
    seq: int
    """The stream sequence this replica had folded when it answered."""


class Created(Written):
    session: SessionOut


def _out(row: dict[str, Any], projections: ProjectionStore) -> SessionOut:
    return SessionOut(
        id=row["session"],
        title=row["title"],
        owner=row["owner"],
        status=row["status"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        turn_count=row["turn_count"],
        active_turn=projections.active_turn(row["tenant"], row["session"]),
        created_seq=row["created_seq"],
        last_seq=row["last_seq"],
    )


@router.post("", status_code=201, response_model=Created)
async def create_session(
    request: Request, principal: CurrentPrincipal, body: CreateSession | None = None
) -> Created:
    body = body or CreateSession()
    session, done = await commands(request).create(principal.tenant, principal.user, body.title)
    seq, at = done.seq, stamp(done.envelope.ts)
    out = SessionOut(
        id=session,
        title=body.title,
        owner=principal.user,
        status="active",
        created_at=at,
        updated_at=at,
        turn_count=0,
        active_turn=None,
        created_seq=seq,
        last_seq=seq,
    )
    return Created(seq=seq, session=out)


@router.get("", response_model=SessionPage)
async def list_sessions(
    request: Request,
    principal: CurrentPrincipal,
    search: Annotated[str | None, Query(max_length=200)] = None,
    status: Literal["active", "deleted", "all"] = "active",
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=40)] = None,
    min_seq: MinSeq = 0,
) -> SessionPage:
    _, projections, _ = parts(request)
    before = cursor_value(cursor)
    await caught_up(request, min_seq)
    rows = projections.sessions(
        principal.tenant,
        limit=limit + 1,
        before_seq=before,
        search=search,
        status=None if status == "all" else status,
        created_after=_bound("created_after", created_after),
        created_before=_bound("created_before", created_before),
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return SessionPage(
        items=[_out(row, projections) for row in rows],
        next_cursor=encode_cursor(rows[-1]["created_seq"]) if more else None,
        seq=projections.checkpoint,
    )


def _bound(field: str, value: datetime | None) -> str | None:
    """A creation-time bound in the stored form (UTC); naive times are taken as UTC."""
    if value is None:
        return None
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    try:
        return stamp(aware)
    except OverflowError:  # an offset that moves it past year 1 or 9999 in UTC
        raise ApiError(
            422,
            "invalid_request",
            f"query field {field!r}: {value.isoformat()} is outside years 1-9999 in UTC; "
            "send a time between them",
            details={"field": field},
        ) from None


@router.get("/{session_id}", response_model=SessionOut)
async def get_session(
    request: Request, principal: CurrentPrincipal, session_id: SessionId, min_seq: MinSeq = 0
) -> SessionOut:
    row = await session_row(request, principal.tenant, session_id, min_seq)
    return _out(row, parts(request)[1])


@router.patch("/{session_id}", response_model=Written)
async def rename_session(
    request: Request, principal: CurrentPrincipal, session_id: SessionId, body: PatchSession
) -> Written:
    done = await commands(request).rename(principal.tenant, session_id, body.title)
    return Written(seq=done.seq)


@router.delete("/{session_id}", response_model=Written)
async def delete_session(
    request: Request,
    principal: CurrentPrincipal,
    session_id: SessionId,
    reason: Annotated[str, Query(max_length=500)] = "",
) -> Written:
    """A tombstone (`session.deleted`): the log stays; purging is a separate admin operation."""
    done = await commands(request).delete(principal.tenant, session_id, reason)
    return Written(seq=done.seq)
