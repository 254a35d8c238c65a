"""`/api/v1/sessions/{id}/state` and `/stats`: what a restore would give the agent, and what
the session's model calls cost, both from this replica's read models (`min_seq` as anywhere)."""

from datetime import UTC, datetime
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from pydantic import BaseModel

from fleet_events.session import SessionImage
from fleet_gateway.auth import CurrentPrincipal
from fleet_gateway.routes.session_reads import ERRORS, PREFIX, MinSeq, SessionId, parts, session_row

router = APIRouter(prefix=PREFIX, tags=["sessions"], responses=ERRORS)


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


@router.get("/{session_id}/state", response_model=SessionStateOut)
async def session_state(
    request: Request, principal: CurrentPrincipal, session_id: SessionId, min_seq: MinSeq = 0
) -> SessionStateOut:
    """What a restore would give the agent: history, core memory, documents, interpreter."""
    row = await session_row(request, principal.tenant, session_id, min_seq)
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
        seq=parts(request)[1].checkpoint,
    )


@router.get("/{session_id}/stats", response_model=SessionStats)
async def session_stats(
    request: Request, principal: CurrentPrincipal, session_id: SessionId, min_seq: MinSeq = 0
) -> SessionStats:
    row = await session_row(request, principal.tenant, session_id, min_seq)
    projections = parts(request)[1]
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
