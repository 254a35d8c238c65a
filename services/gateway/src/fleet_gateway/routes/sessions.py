"""`/api/v1/sessions*`: sessions, their turns, state and stats, as projections of the log.

Writes append one event to the session's `.log` through the gateway's one writer
(`sessionlog.SessionLog.append`) and answer with its stream sequence; reads
answer from this replica's read models and accept `min_seq` (wait, bounded, until the replica
has folded that far), so a client reads its own writes on any replica. Every route is scoped
to the caller's tenant: another tenant's session answers exactly like an unknown one (404).
"""

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Path, Query, Request
from nats.errors import NoRespondersError
from pydantic import BaseModel, Field

from fleet_events import bus, streams
from fleet_events.envelope import new_id
from fleet_events.session import (
    EXECUTION_MODES,
    CancelRequested,
    SessionCreated,
    SessionDeleted,
    SessionImage,
    SessionPurged,
    SessionRenamed,
    TurnRequested,
    run_subject,
)
from fleet_events.session import PurgeSession as PurgeRequest
from fleet_gateway.auth import CurrentPrincipal
from fleet_gateway.components import ready
from fleet_gateway.errors import ApiError, ErrorBody, not_found
from fleet_gateway.frames import FrameError, check_context, check_repo
from fleet_gateway.projections import ProjectionStore
from fleet_gateway.projections.fold import stamp
from fleet_gateway.projections.store import decode_cursor, encode_cursor
from fleet_gateway.quotas import turns_over_quota
from fleet_gateway.routes.common import Strict
from fleet_gateway.sessionlog import (
    PURGE_RUN,
    SessionLog,
    documents_missing,
    log_head,
    session_log,
)
from fleet_mesh import rpc
from fleet_mesh.store import EventStore

ID = r"^[A-Za-z0-9_-]{1,64}$"
MAX_SEQ = 2**53
MAX_MESSAGE_CHARS = 100_000

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
router = APIRouter(prefix="/api/v1/sessions", tags=["sessions"], responses=ERRORS)

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


class CreateSession(Strict):
    title: str = Field(default="", max_length=200)


class PatchSession(Strict):
    title: str = Field(max_length=200)


class DeleteSession(Strict):
    reason: str = Field(default="", max_length=500)


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


class Written(BaseModel):
    seq: int
    """The stream sequence of the stored event: pass it as `min_seq` to read this write."""


class Created(Written):
    session: SessionOut


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


class ModelStats(BaseModel):
    model: str
    calls: int
    errors: int
    tokens_in: int
    tokens_out: int
    latency_ms: float
    cost: float


class SessionStats(BaseModel):
    session: str
    total_calls: int
    total_tokens_in: int
    total_tokens_out: int
    total_latency_ms: float
    total_cost: float
    turns: int
    turn_latency_ms: float
    """Sum over ended turns of request → end, from the log's timestamps."""
    model_breakdown: list[ModelStats]
    seq: int


class SessionStateOut(BaseModel):
    session: str
    history: list[dict[str, Any]]
    core_memory: dict[str, str]
    documents: list[dict[str, Any]]
    active_document: str | None
    interpreter: dict[str, Any] | None
    memory_files: list[dict[str, Any]]
    pending_input: dict[str, Any] | None
    seq: int


def _parts(request: Request) -> tuple[EventStore, ProjectionStore, float]:
    state = request.app.state.gateway
    _, store, projections = ready(state)
    return store, projections, state.settings.read_wait_max_s


async def _caught_up(request: Request, seq: int) -> None:
    """Wait (bounded) until this replica has folded the log up to `seq`. A `seq` past the
    log's end was never returned by a write: that is the client's error (422), not a wait."""
    _, projections, wait_s = _parts(request)
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


async def _session(request: Request, tenant: str, session: str, min_seq: int) -> dict[str, Any]:
    """The session's row once folded to `min_seq`; a row not there yet while the log has the
    session (created on another replica a moment ago) is waited for up to the log's head."""
    store, projections, _ = _parts(request)
    await _caught_up(request, min_seq)
    row = projections.session(tenant, session)
    if row is None:
        head = await log_head(store, tenant, session)  # 404 when the log has none either
        await _caught_up(request, head.seq)
        row = projections.session(tenant, session)
        if row is None:
            raise not_found("session", session)
    return row


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


def _cursor(cursor: str | None) -> int | None:
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


def _refuse_deleted(row: dict[str, Any]) -> None:
    if row["status"] == "deleted":
        raise ApiError(
            409,
            "session_deleted",
            f"session {row['session']!r} is deleted (a tombstone since seq {row['last_seq']}); "
            "create a new session",
            details={"session": row["session"]},
        )


@router.post("", status_code=201, response_model=Created)
async def create_session(
    request: Request, principal: CurrentPrincipal, body: CreateSession | None = None
) -> Created:
    body = body or CreateSession()
    session = new_id()
    done = await (await session_log(request)).append(
        principal.tenant,
        session,
        SessionCreated(title=body.title, owner=principal.user),
        new_session=True,
    )
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
    _, projections, _ = _parts(request)
    before = _cursor(cursor)
    await _caught_up(request, min_seq)
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
    row = await _session(request, principal.tenant, session_id, min_seq)
    return _out(row, _parts(request)[1])


@router.patch("/{session_id}", response_model=Written)
async def rename_session(
    request: Request, principal: CurrentPrincipal, session_id: SessionId, body: PatchSession
) -> Written:
    _refuse_deleted(await _session(request, principal.tenant, session_id, 0))
    done = await (await session_log(request)).append(
        principal.tenant, session_id, SessionRenamed(title=body.title)
    )
    return Written(seq=done.seq)


@router.delete("/{session_id}", response_model=Written)
async def delete_session(
    request: Request,
    principal: CurrentPrincipal,
    session_id: SessionId,
    reason: Annotated[str, Query(max_length=500)] = "",
) -> Written:
    """A tombstone (`session.deleted`): the log stays; purging is a separate admin operation."""
    _refuse_deleted(await _session(request, principal.tenant, session_id, 0))
    done = await (await session_log(request)).append(
        principal.tenant, session_id, SessionDeleted(reason=reason)
    )
    return Written(seq=done.seq)


@router.get("/{session_id}/turns", response_model=TurnPage)
async def list_turns(
    request: Request,
    principal: CurrentPrincipal,
    session_id: SessionId,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=40)] = None,
    min_seq: MinSeq = 0,
) -> TurnPage:
    after = _cursor(cursor)
    await _session(request, principal.tenant, session_id, min_seq)
    projections = _parts(request)[1]
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
    request: Request, principal: CurrentPrincipal, session_id: SessionId, body: RequestTurn
) -> TurnAccepted:
    """Append `turn.requested`; the agent's dispatcher admits or refuses it (`turn.refused`
    when another turn runs or the session is deleted), so watch `/turns` for its status."""
    assert body.mode in EXECUTION_MODES
    _, projections, _ = _parts(request)
    limit = request.app.state.gateway.settings.tenant_concurrent_turns
    active = projections.active_turns(principal.tenant)
    if active >= limit:
        raise turns_over_quota(principal.tenant, active, limit)
    try:
        check_repo(body.repo_url, body.repo_ref)
        check_context(body.document_ids, body.context_paths)
    except FrameError as exc:
        raise ApiError(422, exc.code, exc.message) from None
    log = await session_log(request)
    if body.document_ids:
        await _check_documents(log, principal.tenant, session_id, body.document_ids)
    turn = new_id()
    done = await log.append(
        principal.tenant,
        session_id,
        TurnRequested(
            message=body.message,
            mode=body.mode,
            document_ids=tuple(body.document_ids),
            context_paths=tuple(body.context_paths),
            repo_url=body.repo_url,
            repo_ref=body.repo_ref,
        ),
        turn=turn,
    )
    return TurnAccepted(seq=done.seq, session=session_id, turn=turn)


async def _check_documents(log: SessionLog, tenant: str, session: str, named: list[str]) -> None:
    """422 `document_not_found` (nothing stored) unless every named document is loaded."""
    why = await documents_missing(log.store, tenant, session, named)
    if why is not None:
        raise ApiError(422, "document_not_found", why)


@router.post("/{session_id}/cancel", status_code=202, response_model=TurnAccepted)
async def cancel_turn(
    request: Request,
    principal: CurrentPrincipal,
    session_id: SessionId,
    body: RequestCancel | None = None,
    min_seq: MinSeq = 0,
) -> TurnAccepted:
    body = body or RequestCancel()
    _, projections, _ = _parts(request)
    await _session(request, principal.tenant, session_id, min_seq)
    turn = body.turn or projections.active_turn(principal.tenant, session_id)
    if turn is None:
        raise ApiError(
            409,
            "no_active_turn",
            f"session {session_id!r} has no queued or running turn to cancel (as of seq "
            f"{projections.checkpoint}); pass `turn`, or `min_seq` from your turn request",
            details={"session": session_id},
        )
    if projections.turn(principal.tenant, session_id, turn) is None:
        raise not_found("turn", turn)
    done = await (await session_log(request)).append(
        principal.tenant, session_id, CancelRequested(reason=body.reason), turn=turn
    )
    return TurnAccepted(seq=done.seq, session=session_id, turn=turn)


@router.get("/{session_id}/state", response_model=SessionStateOut)
async def session_state(
    request: Request, principal: CurrentPrincipal, session_id: SessionId, min_seq: MinSeq = 0
) -> SessionStateOut:
    """What a restore would give the agent: history, core memory, documents, interpreter."""
    row = await _session(request, principal.tenant, session_id, min_seq)
    image = msgspec.json.decode(row["image"], type=SessionImage)
    plain = msgspec.to_builtins(image)
    pending = msgspec.json.decode(row["pending_input"]) if row["pending_input"] else None
    return SessionStateOut(
        session=session_id,
        history=plain.get("turns", []),
        core_memory=msgspec.to_builtins(image.core_memory),
        documents=plain.get("documents", []),
        active_document=image.active_document,
        interpreter=msgspec.to_builtins(image.interpreter) if image.interpreter else None,
        memory_files=plain.get("memory_files", []),
        pending_input=pending,
        seq=_parts(request)[1].checkpoint,
    )


@router.get("/{session_id}/stats", response_model=SessionStats)
async def session_stats(
    request: Request, principal: CurrentPrincipal, session_id: SessionId, min_seq: MinSeq = 0
) -> SessionStats:
    row = await _session(request, principal.tenant, session_id, min_seq)
    projections = _parts(request)[1]
    models = [
        ModelStats(**{k: v for k, v in m.items() if k not in ("tenant", "session")})
        for m in projections.model_stats(principal.tenant, session_id)
    ]
    turn_ms = 0.0
    for started, ended in projections.latency_of_turns(principal.tenant, session_id):
        if ended is not None:
            turn_ms += (_parse(ended) - _parse(started)).total_seconds() * 1000
    return SessionStats(
        session=session_id,
        total_calls=sum(m.calls for m in models),
        total_tokens_in=sum(m.tokens_in for m in models),
        total_tokens_out=sum(m.tokens_out for m in models),
        total_latency_ms=round(sum(m.latency_ms for m in models), 3),
        total_cost=round(sum(m.cost for m in models), 9),
        turns=row["turn_count"],
        turn_latency_ms=round(turn_ms, 3),
        model_breakdown=models,
        seq=projections.checkpoint,
    )


def _parse(stamp_text: str) -> datetime:
    return datetime.strptime(stamp_text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


# -- purge: an admin operation, through the checkpointer ----------------------------------

# The marker goes on `fleet.session.<tenant>.<session>.run.purge` (`sessionlog.PURGE_RUN`), a
# subject of its own: the `.log` stays empty, so every route (and the agent) sees no session,
# and the writer (`sessionlog.append_event`) refuses to open a session under the id again.
PURGE_TIMEOUT_S = 30.0


class PurgeSession(Strict):
    reason: str = Field(default="", max_length=500)


class PurgedSession(Written):
    session: str
    receipt: int
    """The number of the signed checkpoint that is the receipt."""
    digest: str
    key: str
    """The id of the checkpoint key that signed it."""
    purged: dict[str, tuple[int, str]]
    """Each purged subject's last sequence and hash, as the receipt pins them."""


PURGE_ERRORS: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorBody, "description": "the caller is not an admin"},
    409: {"model": ErrorBody, "description": "the session is not deleted"},
    503: {"model": ErrorBody, "description": "no checkpointer answers"},
    504: {"model": ErrorBody, "description": "the checkpointer did not answer in time"},
}


@router.post("/{session_id}/purge", response_model=PurgedSession, responses=PURGE_ERRORS)
async def purge_session(
    request: Request,
    principal: CurrentPrincipal,
    session_id: SessionId,
    body: PurgeSession | None = None,
) -> PurgedSession:
    """Remove a deleted session's events (its log and every run) for good, behind a receipt:
    the checkpointer (the one process holding the checkpoint key) checkpoints what is there,
    signs a checkpoint naming each subject's last sequence and hash, and only then purges, so
    an auditor's verification against the checkpoints still passes and names the receipt.
    Admins only; the session must be deleted first. `session.purged` then records the receipt
    on the session's `.run.purge` subject and every replica drops the session's rows."""
    body = body or PurgeSession()
    store = _parts(request)[0]
    head = await log_head(store, principal.tenant, session_id)  # 404: unknown or foreign
    row = await _session(request, principal.tenant, session_id, head.seq)  # as of its head
    if not principal.admin:
        raise ApiError(
            403,
            "admin_required",
            "purging a session is an admin operation: ask an admin of your tenant (a token "
            "with the admin claim)",
        )
    if row["status"] != "deleted":
        raise ApiError(
            409,
            "session_not_deleted",
            f"session {session_id!r} is {row['status']}: delete it first (DELETE "
            f"/api/v1/sessions/{session_id}), then purge",
            details={"session": session_id, "status": row["status"]},
        )
    log = await session_log(request)
    ask = PurgeRequest(
        request_id=new_id(),
        tenant=principal.tenant,
        session=session_id,
        by=principal.user,
        reason=body.reason,
    )
    try:
        receipt = await rpc.call_verb(log.nc, bus.PURGE_SESSION, ask, timeout=PURGE_TIMEOUT_S)
    except NoRespondersError:
        raise ApiError(
            503,
            "audit_unavailable",
            "no checkpointer answers on the bus: a purge needs the process holding the "
            "checkpoint key (fleet up runs one; in a cluster `python -m fleet_mesh."
            "checkpoints`); nothing was purged",
            headers={"Retry-After": "5"},
        ) from None
    except TimeoutError:
        raise ApiError(
            504,
            "audit_timeout",
            f"the checkpointer did not answer within {PURGE_TIMEOUT_S:g} s; it may still "
            "purge: read the session again before retrying",
        ) from None
    except rpc.RemoteError as exc:
        raise ApiError(409, "purge_refused", f"the checkpointer refused: {exc.message}") from None
    marker = log.envelope(
        principal.tenant,
        session_id,
        SessionPurged(
            receipt=receipt.receipt,
            receipt_digest=receipt.digest,
            purged=receipt.purged,
            by=principal.user,
            reason=body.reason,
        ),
    )
    marker = msgspec.structs.replace(marker, run=PURGE_RUN)
    subject = run_subject(principal.tenant, session_id, PURGE_RUN)
    stored = await log.store.append(subject, marker, expect=await log.store.head(subject))
    return PurgedSession(
        seq=stored.seq,
        session=session_id,
        receipt=receipt.receipt,
        digest=receipt.digest,
        key=receipt.key,
        purged=receipt.purged,
    )
