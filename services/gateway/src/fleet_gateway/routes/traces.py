"""Runs and traces, read from the log (the session's `.log` and its run subjects) on each request.

- `GET /api/v1/sessions/{id}/traces`: one trace per turn, with its totals.
- `GET /api/v1/sessions/{id}/trace-debug` (`trace_id` or `turn_id`, else the latest turn): the
  span tree: turn → runs → iterations → LLM calls and cells → tool calls → child runs, each with
  tokens, cost and duration.
- `POST /api/v1/sessions/{id}/trace-export`: the same as OTLP/JSON (GenAI conventions), ready to
  POST to any collector's `/v1/traces`.
- `GET /api/v1/runs/{run_id}/steps`: one run's events as steps.
- `POST /api/v1/traces/feedback`: a person's judgement of a turn, recorded on its session's log.

A session is found only in the caller's tenant (the subjects carry the tenant), so another
tenant's session or run is the same 404 as one that exists nowhere.
"""

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from fleet_events import Actor, Envelope
from fleet_events.run import CellExecuted, IterationPlanned, LlmCalled, ToolCalled, ToolReturned
from fleet_events.session import TraceFeedbackRecorded
from fleet_gateway.auth import CurrentPrincipal, CurrentTenant
from fleet_gateway.components import ready
from fleet_gateway.errors import ApiError, ErrorBody, not_found
from fleet_gateway.routes.common import version
from fleet_gateway.sessionlog import session_log
from fleet_gateway.traces import otlp, reading
from fleet_gateway.traces.tree import Attr, Span, Trace, build, preview
from fleet_gateway.traces.tree import trace_id as trace_of
from fleet_gateway.writes import append_to_log, log_head
from fleet_mesh.store import EventStore

router = APIRouter(tags=["traces"])
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 404, 422, 429, 503)
}
ID = r"^[A-Za-z0-9_-]{1,64}$"
SessionId = Annotated[str, Path(pattern=ID, description="a session id")]
RunId = Annotated[str, Path(pattern=ID, description="a run id (as /trace-debug shows it)")]
HexTraceId = Annotated[str | None, Query(pattern=r"^[0-9a-f]{32}$")]
TurnId = Annotated[str | None, Query(pattern=ID)]


class TraceSummary(BaseModel):
    trace_id: str
    turn_id: str
    status: str
    started_at: datetime
    ended_at: datetime | None
    duration_ms: float | None
    span_count: int
    llm_calls: int
    tokens_in: int
    tokens_out: int
    cost: float
    request_preview: str
    response_preview: str


class TraceList(BaseModel):
    session_id: str
    items: list[TraceSummary]


class SpanOut(BaseModel):
    span_id: str
    parent_span_id: str | None
    name: str
    span_type: str
    status: str
    error: str
    started_at: datetime
    ended_at: datetime | None
    duration_ms: float | None
    tokens_in: int
    tokens_out: int
    cost: float
    llm_calls: int
    attributes: dict[str, Attr]


class Performance(BaseModel):
    duration_ms: float | None
    llm_calls: int
    tokens_in: int
    tokens_out: int
    cost: float
    runs: int
    iterations: int
    cells: int
    tool_calls: int
    errors: int


class TraceDebug(BaseModel):
    trace_id: str
    turn_id: str
    session_id: str
    state: str
    resolved_from: Literal["trace_id", "turn_id", "latest"]
    request_preview: str
    response_preview: str
    span_count: int
    performance_summary: Performance
    spans: list[SpanOut]


class ExportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trace_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    turn_id: str | None = Field(default=None, pattern=ID)


class OtlpExport(BaseModel):
    """An OTLP/JSON `ExportTraceServiceRequest`: POST it as is to a collector's `/v1/traces`."""

    model_config = ConfigDict(extra="allow")
    resourceSpans: list[dict[str, Any]]  # noqa: N815  (OTLP/JSON's own field name)


class Step(BaseModel):
    id: str
    step_index: int
    step_type: str
    tool_name: str | None
    tokens_in: int
    tokens_out: int
    latency_ms: float | None
    created_at: datetime
    status: Literal["ok", "error"]
    error: str
    preview: str


class RunSteps(BaseModel):
    run_id: str
    session_id: str
    turn_id: str | None
    items: list[Step]


class Feedback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(pattern=ID)
    trace_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    turn_id: str | None = Field(default=None, pattern=ID)
    is_correct: bool | None = None
    comment: str = Field(default="", max_length=4000)
    expected_response: str = Field(default="", max_length=20_000)


class FeedbackLogged(BaseModel):
    trace_id: str
    turn_id: str
    session_id: str
    feedback_logged: bool
    expectation_logged: bool
    seq: int


# -- reading --------------------------------------------------------------------------------


Turns = dict[str, list[Envelope[Any]]]


async def _turns(request: Request, tenant: str, session: str) -> Turns:
    """The session's trace events by turn; 404 unless the caller's tenant has the session."""
    _, store, _ = ready(request.app.state.gateway)
    await log_head(store, tenant, session)
    log = await session_log(request)
    return reading.by_turn(await _cache(request).events(store, log.codec, tenant, session))


def _cache(request: Request) -> reading.SessionCache:
    """This app's cache of sessions' trace events (made on first use, like the session log's
    handles): a trace polled while its turn runs reads only what was stored since."""
    cache: reading.SessionCache | None = getattr(request.app.state, "trace_cache", None)
    if cache is None:
        cache = request.app.state.trace_cache = reading.SessionCache()
    return cache


def _pick(
    turns: Turns, tenant: str, session: str, trace: str | None, turn: str | None
) -> tuple[Trace, Literal["trace_id", "turn_id", "latest"]]:
    """The one trace asked for, built alone (a trace id is the turn's, derived)."""
    if trace is not None:
        for found in turns:
            if trace_of(tenant, session, found) == trace:
                return build(tenant, session, found, turns[found]), "trace_id"
        raise ApiError(
            404, "trace_not_found",
            f"no trace {trace!r} in session {session!r}: list them with "
            f"GET /api/v1/sessions/{session}/traces",
            details={"trace_id": trace},
        )  # fmt: skip
    if turn is not None:
        if turn in turns:
            return build(tenant, session, turn, turns[turn]), "turn_id"
        raise not_found("turn", turn)
    if not turns:
        raise ApiError(
            404, "trace_not_found",
            f"session {session!r} has no turns yet, so no trace: send a message first",
            details={"session_id": session},
        )  # fmt: skip
    latest = list(turns)[-1]
    return build(tenant, session, latest, turns[latest]), "latest"


def _summary(trace: Trace) -> TraceSummary:
    root = trace.root
    return TraceSummary(
        trace_id=trace.trace_id, turn_id=trace.turn, status=trace.status,
        started_at=root.start, ended_at=root.end, duration_ms=root.duration_ms,
        span_count=len(trace.spans), llm_calls=root.llm_calls, tokens_in=root.tokens_in,
        tokens_out=root.tokens_out, cost=round(root.cost, 8),
        request_preview=preview(trace.message), response_preview=preview(trace.answer),
    )  # fmt: skip


def _span(span: Span) -> SpanOut:
    return SpanOut(
        span_id=span.span_id, parent_span_id=span.parent_id, name=span.name,
        span_type=span.kind, status=span.status, error=preview(span.error, 1000),
        started_at=span.start, ended_at=span.end, duration_ms=span.duration_ms,
        tokens_in=span.tokens_in, tokens_out=span.tokens_out, cost=round(span.cost, 8),
        llm_calls=span.llm_calls, attributes=span.attributes,
    )  # fmt: skip


def _count(trace: Trace, *kinds: str) -> int:
    return sum(1 for s in trace.spans if s.kind in kinds)


# -- routes ---------------------------------------------------------------------------------


@router.get("/sessions/{session_id}/traces", response_model=TraceList, responses=ERRORS)
async def list_traces(session_id: SessionId, tenant: CurrentTenant, request: Request) -> TraceList:
    turns = await _turns(request, tenant, session_id)
    traces = [build(tenant, session_id, turn, events) for turn, events in turns.items()]
    return TraceList(session_id=session_id, items=[_summary(t) for t in traces])


@router.get("/sessions/{session_id}/trace-debug", response_model=TraceDebug, responses=ERRORS)
async def trace_debug(
    session_id: SessionId,
    tenant: CurrentTenant,
    request: Request,
    trace_id: HexTraceId = None,
    turn_id: TurnId = None,
) -> TraceDebug:
    turns = await _turns(request, tenant, session_id)
    trace, resolved = _pick(turns, tenant, session_id, trace_id, turn_id)
    root = trace.root
    performance = Performance(
        duration_ms=root.duration_ms, llm_calls=root.llm_calls, tokens_in=root.tokens_in,
        tokens_out=root.tokens_out, cost=round(root.cost, 8),
        runs=_count(trace, "run", "child"), iterations=_count(trace, "iteration"),
        cells=_count(trace, "cell"), tool_calls=_count(trace, "tool"),
        errors=sum(1 for s in trace.spans if s.status == "error"),
    )  # fmt: skip
    return TraceDebug(
        trace_id=trace.trace_id, turn_id=trace.turn, session_id=session_id, state=trace.status,
        resolved_from=resolved, request_preview=preview(trace.message),
        response_preview=preview(trace.answer), span_count=len(trace.spans),
        performance_summary=performance, spans=[_span(s) for s in trace.spans],
    )  # fmt: skip


@router.post("/sessions/{session_id}/trace-export", response_model=OtlpExport, responses=ERRORS)
async def trace_export(
    session_id: SessionId,
    tenant: CurrentTenant,
    request: Request,
    body: Annotated[ExportRequest | None, Body()] = None,
) -> OtlpExport:
    """Every turn of the session (or the one `trace_id` / `turn_id` names) as OTLP/JSON."""
    ask = body or ExportRequest()
    turns = await _turns(request, tenant, session_id)
    if ask.trace_id is not None or ask.turn_id is not None:
        traces = [_pick(turns, tenant, session_id, ask.trace_id, ask.turn_id)[0]]
    else:
        traces = [build(tenant, session_id, turn, events) for turn, events in turns.items()]
    state = request.app.state.gateway
    document = otlp.export_request(traces, service_version=version(), replica=state.replica)
    return OtlpExport(**document)


@router.get("/runs/{run_id}/steps", response_model=RunSteps, responses=ERRORS)
async def run_steps(run_id: RunId, tenant: CurrentTenant, request: Request) -> RunSteps:
    _, store, _ = ready(request.app.state.gateway)
    log = await session_log(request)
    events = await reading.run_events(store, log.codec, tenant, run_id)
    if not events:
        raise ApiError(
            404, "run_not_found",
            f"no run {run_id!r} in your tenant: GET /api/v1/sessions/{{id}}/trace-debug shows a "
            "turn's runs (attribute fleet.run.id)",
            details={"run_id": run_id},
        )  # fmt: skip
    first = events[0]
    return RunSteps(
        run_id=run_id, session_id=first.session or "", turn_id=first.turn,
        items=[_step(index, env) for index, env in enumerate(events)],
    )  # fmt: skip


def _step(index: int, env: Envelope[Any]) -> Step:
    data = env.data
    tag = str(type(data).__struct_config__.tag)
    tool: str | None = None
    tokens_in = tokens_out = 0
    latency: float | None = None
    error = str(getattr(data, "error", "") or "")
    shown: object = ""
    if isinstance(data, LlmCalled):
        tokens_in, tokens_out, latency = data.prompt_tokens, data.completion_tokens, data.latency_ms
        shown = data.response if isinstance(data.response, str) else "(response offloaded)"
    elif isinstance(data, CellExecuted):
        latency, shown = data.duration_ms, data.code
    elif isinstance(data, ToolCalled):
        tool, shown = data.tool, data.args
    elif isinstance(data, ToolReturned):
        tool, latency, shown = data.tool, data.duration_ms, data.result
    elif isinstance(data, IterationPlanned):
        tool, shown = data.tool or None, data.code or data.reasoning
    else:
        shown = getattr(data, "answer", "") or getattr(data, "task", "")
    return Step(
        id=env.id, step_index=index, step_type=tag.removeprefix("run."), tool_name=tool,
        tokens_in=tokens_in, tokens_out=tokens_out, latency_ms=latency, created_at=env.ts,
        status="error" if error else "ok", error=preview(error, 1000), preview=preview(shown),
    )  # fmt: skip


@router.post("/traces/feedback", response_model=FeedbackLogged, responses=ERRORS)
async def trace_feedback(
    body: Annotated[Feedback, Body()], principal: CurrentPrincipal, request: Request
) -> FeedbackLogged:
    """Recorded only on a turn of a session the caller's tenant holds (else 404, as for a
    session that does not exist)."""
    if body.trace_id is None and body.turn_id is None:
        raise ApiError(
            422, "invalid_request",
            "feedback needs trace_id (as GET /api/v1/sessions/{id}/traces lists it) or turn_id",
            details={"problems": [{"field": "trace_id", "where": "body",
                                   "problem": "trace_id or turn_id is required", "value": ""}]},
        )  # fmt: skip
    tenant, session = principal.tenant, body.session_id
    trace, _ = _pick(
        await _turns(request, tenant, session), tenant, session, body.trace_id, body.turn_id
    )
    if body.turn_id is not None and body.trace_id is not None and trace.turn != body.turn_id:
        raise ApiError(
            422, "trace_turn_mismatch",
            f"trace_id {body.trace_id!r} is turn {trace.turn!r}, not {body.turn_id!r}: send one",
        )  # fmt: skip
    store: EventStore = ready(request.app.state.gateway)[1]
    event = TraceFeedbackRecorded(
        trace_id=trace.trace_id, is_correct=body.is_correct, comment=body.comment,
        expected_response=body.expected_response, user=principal.user[:200],
    )  # fmt: skip
    actor = Actor(service="gateway", replica=request.app.state.gateway.replica)
    seq, _ = await append_to_log(store, actor, tenant, session, event, turn=trace.turn)
    return FeedbackLogged(
        trace_id=trace.trace_id, turn_id=trace.turn, session_id=session,
        feedback_logged=True, expectation_logged=bool(body.expected_response), seq=seq,
    )  # fmt: skip
