"""`/api/v1/sessions/{id}/turns` and `/cancel`: ask for a turn, list them, cancel one.

A turn request is the session command `request_turn` (the WebSocket `message` frame calls the
same one): an optional `Idempotency-Key` header (as Stripe's API takes it) makes a retry
return the first answer and store nothing more; the key is scoped to the caller's tenant and
the session. The agent's dispatcher admits or refuses the turn (`turn.refused` when another
turn runs or the session is deleted), so watch `/turns` for its status.
"""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from pydantic import BaseModel, Field

from fleet_events.session import EXECUTION_MODES, TurnRequested
from fleet_gateway.auth import CurrentPrincipal
from fleet_gateway.errors import ApiError, ErrorBody
from fleet_gateway.frames import FrameError, check_context, check_repo
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

MAX_MESSAGE_CHARS = 100_000
ID = r"^[A-Za-z0-9_-]{1,64}$"

TURN_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    400: {"model": ErrorBody, "description": "the Idempotency-Key header is empty, over 255 "
          "characters or not printable"},
    409: {"model": ErrorBody, "description": "a request under the same Idempotency-Key is in "
          "progress; or (cancel) no turn is running"},
    422: {"model": ErrorBody, "description": "a field is invalid, a named document is not "
          "loaded, or the Idempotency-Key was used for a different body"},
}  # fmt: skip
router = APIRouter(prefix=PREFIX, tags=["sessions"], responses=TURN_ERRORS)

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="1-255 printable characters (a UUID is usual), the same on every retry of "
        "this request: a retry answers the first answer and stores nothing more; a different "
        "body under the same key is 422. Scoped to your tenant and this session",
    ),
]


class RequestTurn(Strict):
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    mode: Literal["auto", "rlm_only", "tools_only"] = "auto"
    document_ids: list[str] = Field(
        default=[], description="aliases of documents loaded in this session to read into the turn"
    )
    context_paths: list[str] = Field(
        default=[], description="paths in the session sandbox's working directory to name"
    )
    repo_url: str | None = Field(
        default=None, description="a git repository (https, ssh or git URL) cloned for the turn"
    )
    repo_ref: str | None = Field(default=None, description="its branch, tag or commit id")


class RequestCancel(Strict):
    turn: str | None = Field(
        default=None, pattern=ID, description="the turn to cancel; default: the running one"
    )
    reason: str = Field(default="", max_length=500)


class TurnAccepted(Written):
    session: str
    turn: str


class TurnOut(BaseModel):
    id: str
    turn_index: int
    user_message: str
    assistant_message: str
    mode: str
    status: Literal["queued", "running", "completed", "failed", "cancelled", "refused"]
    error: str
    code: str
    attempts: int
    cancel_requested: bool
    created_at: str
    ended_at: str | None
    requested_seq: int
    last_seq: int


class TurnPage(BaseModel):
    items: list[TurnOut]
    next_cursor: str | None
    seq: int


def _turn_out(row: dict[str, Any]) -> TurnOut:
    return TurnOut(
        id=row["turn"],
        turn_index=row["turn_index"],
        user_message=row["message"],
        assistant_message=row["answer"],
        mode=row["mode"],
        status=row["status"],
        error=row["error"],
        code=row["code"],
        attempts=row["attempts"],
        cancel_requested=bool(row["cancel_requested"]),
        created_at=row["requested_at"],
        ended_at=row["ended_at"],
        requested_seq=row["requested_seq"],
        last_seq=row["last_seq"],
    )


@router.get("/{session_id}/turns", response_model=TurnPage)
async def list_turns(
    request: Request,
    principal: CurrentPrincipal,
    session_id: SessionId,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=40)] = None,
    min_seq: MinSeq = 0,
) -> TurnPage:
    after = cursor_value(cursor)
    await session_row(request, principal.tenant, session_id, min_seq)
    projections = parts(request)[1]
    rows = projections.turns(
        principal.tenant, session_id, limit=limit + 1, after_index=-1 if after is None else after
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return TurnPage(
        items=[_turn_out(row) for row in rows],
        next_cursor=encode_cursor(rows[-1]["turn_index"]) if more else None,
        seq=projections.checkpoint,
    )


@router.post("/{session_id}/turns", status_code=202, response_model=TurnAccepted)
async def request_turn(
    request: Request,
    principal: CurrentPrincipal,
    session_id: SessionId,
    body: RequestTurn,
    idempotency_key: IdempotencyKey = None,
) -> TurnAccepted:
    """Append `turn.requested`; the agent's dispatcher admits or refuses it (`turn.refused`
    when another turn runs or the session is deleted), so watch `/turns` for its status."""
    assert body.mode in EXECUTION_MODES
    try:
        check_repo(body.repo_url, body.repo_ref)
        check_context(body.document_ids, body.context_paths)
    except FrameError as exc:
        raise ApiError(422, exc.code, exc.message) from None
    asked = TurnRequested(
        message=body.message,
        mode=body.mode,
        document_ids=tuple(body.document_ids),
        context_paths=tuple(body.context_paths),
        repo_url=body.repo_url,
        repo_ref=body.repo_ref,
    )
    done = await commands(request).request_turn(
        principal.tenant, session_id, asked, key=idempotency_key
    )
    return TurnAccepted(seq=done.seq, session=session_id, turn=done.turn)


@router.post("/{session_id}/cancel", status_code=202, response_model=TurnAccepted)
async def cancel_turn(
    request: Request,
    principal: CurrentPrincipal,
    session_id: SessionId,
    body: RequestCancel | None = None,
    min_seq: MinSeq = 0,
) -> TurnAccepted:
    """`turn.cancel_requested` for the named turn, default the latest one not ended (decided
    from the session's log; `min_seq` is still accepted and waited for)."""
    body = body or RequestCancel()
    await caught_up(request, min_seq)
    done = await commands(request).cancel(principal.tenant, session_id, body.turn, body.reason)
    return TurnAccepted(seq=done.seq, session=session_id, turn=done.turn)
