"""The span tree of one turn, folded from the session's events (its `.log` and every run).

Pure: envelopes in stream order in, spans out; no I/O, no clock. Every id is derived from the
log (sha256 of the trace's scope and the event or run it stands for), so a trace built twice,
on any replica, live or later, has the same trace and span ids, and an OTLP viewer given both
shows one trace.

The shape: turn → root run → iterations → (the LLM call that planned each, its cell) → what
the cell did (sub-LLM calls, host tool calls) → child runs under the tool call that asked for
them (`RunStarted.parent_call`), recursively. Times come from the envelopes: an event is
stamped when it is recorded, so a call's span ends at its event and starts `latency_ms`
(`duration_ms`) before it.
"""

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from fleet_events import Envelope
from fleet_events.run import (
    CellExecuted,
    ChildRunFailed,
    ChildRunRequested,
    Escalated,
    FellBack,
    IterationPlanned,
    LlmCalled,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    ToolCalled,
    ToolReturned,
)
from fleet_events.session import (
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRefused,
    TurnRequested,
    TurnStarted,
)

PREVIEW_CHARS = 240
"""What a span shows of a prompt, an answer, a cell or a result (the earlier system's cap)."""

KINDS = ("turn", "run", "iteration", "llm", "cell", "tool", "child")

Attr = str | int | float | bool


@dataclass
class Span:
    span_id: str
    parent_id: str | None
    kind: str
    name: str
    start: datetime
    end: datetime | None = None
    status: str = "ok"
    """`ok`, `error` (a failed call, cell, tool or run; a cancel) or `open` (not ended yet)."""
    error: str = ""
    attributes: dict[str, Attr] = field(default_factory=dict)
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    llm_calls: int = 0
    """Of this span and everything under it (an LLM span counts itself)."""

    @property
    def duration_ms(self) -> float | None:
        if self.end is None:
            return None
        return round((self.end - self.start).total_seconds() * 1000, 3)


@dataclass
class Trace:
    trace_id: str
    tenant: str
    session: str
    turn: str
    spans: list[Span]
    """Parents before children (the turn first), each level in time order."""
    message: str = ""
    answer: str = ""
    status: str = "open"
    """`completed`, `failed`, `cancelled`, `refused` or `open`."""

    @property
    def root(self) -> Span:
        return self.spans[0]


def preview(value: object, limit: int = PREVIEW_CHARS) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hex(chars: int, *parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:chars]


def trace_id(tenant: str, session: str, turn: str) -> str:
    """32 lowercase hex characters, fixed by the turn (OTLP's 16-byte trace id)."""
    return _hex(32, "trace", tenant, session, turn)


class _Builder:
    def __init__(self, tenant: str, session: str, turn: str) -> None:
        self.scope = (tenant, session, turn)
        self.spans: dict[str, Span] = {}
        self.runs: dict[str, str] = {}  # run id → its span
        self.iterations: dict[tuple[str, int], str] = {}
        self.planning: dict[str, str] = {}  # the LLM call id that planned an iteration → it
        self.cells: dict[tuple[str, str], str] = {}
        self.tools: dict[tuple[str, str], str] = {}  # (run, call id) → tool span
        self.tool_calls: dict[str, str] = {}  # call id → tool span, over the whole tree
        self.llm: list[tuple[str, str, LlmCalled]] = []  # (span, run, event): placed last
        self.pending_cells: list[tuple[str, str, CellExecuted]] = []
        self.pending_runs: list[tuple[str, str | None, RunStarted]] = []
        self.children: dict[str, ChildRunRequested] = {}
        self.child_failed: dict[str, tuple[datetime, ChildRunFailed]] = {}

    def span_id(self, *parts: str) -> str:
        return _hex(16, "span", *self.scope, *parts)

    def add(self, span: Span) -> Span:
        self.spans[span.span_id] = span
        return span


_NEVER = datetime.fromtimestamp(0, UTC)


def _run_end(span: Span, ts: datetime, status: str, error: str) -> None:
    span.end, span.status, span.error = ts, status, error


def build(tenant: str, session: str, turn: str, events: Iterable[Envelope[Any]]) -> Trace:
    """The trace of `turn` from the session's events in stream order (events of other turns
    are skipped, so the whole session's replay can be passed)."""
    b = _Builder(tenant, session, turn)
    turn_span = b.add(Span(b.span_id("turn"), None, "turn", "invoke_workflow turn", _NEVER))
    turn_span.status = "open"
    trace = Trace(trace_id(tenant, session, turn), tenant, session, turn, [])
    first: datetime | None = None
    for env in events:
        if env.turn != turn:
            continue
        first = env.ts if first is None else min(first, env.ts)
        _fold(b, trace, turn_span, env)
    if turn_span.start is _NEVER:  # no turn event (a partial log): the first of its events
        turn_span.start = first or _NEVER
    _place(b, turn_span)
    ordered = _ordered(b, turn_span)
    _totals(ordered)
    trace.spans = ordered
    return trace


def _fold(b: _Builder, trace: Trace, turn_span: Span, env: Envelope[Any]) -> None:
    data, ts = env.data, env.ts
    if isinstance(data, TurnRequested):
        turn_span.start = ts if turn_span.start is _NEVER else min(turn_span.start, ts)
        trace.message = data.message
        turn_span.attributes.update({"fleet.turn.mode": data.mode})
    elif isinstance(data, TurnStarted):
        turn_span.start = ts if turn_span.start is _NEVER else min(turn_span.start, ts)
        turn_span.attributes.update({"fleet.turn.attempt": data.attempt})
    elif isinstance(data, TurnCompleted):
        _run_end(turn_span, ts, "ok", "")
        trace.answer, trace.status = data.answer, "completed"
    elif isinstance(data, TurnFailed):
        _run_end(turn_span, ts, "error", data.error)
        trace.status = "failed"
    elif isinstance(data, TurnCancelled):
        _run_end(turn_span, ts, "error", f"cancelled: {data.reason}".rstrip(": "))
        trace.answer, trace.status = data.partial, "cancelled"
    elif isinstance(data, TurnRefused):
        _run_end(turn_span, ts, "error", f"refused ({data.reason}): {data.message}")
        trace.status = "refused"
    elif env.run is not None:
        _fold_run(b, env.run, env, data, ts)


def _fold_run(b: _Builder, run: str, env: Envelope[Any], data: object, ts: datetime) -> None:
    run_span = b.spans.get(b.runs.get(run, ""))
    if isinstance(data, RunStarted):
        span = b.add(Span(b.span_id("run", run), None, "run", f"invoke_agent {data.kind}", ts))
        span.status = "open"
        span.attributes.update(
            {
                "fleet.run.id": run, "fleet.run.kind": data.kind, "fleet.run.depth": data.depth,
                "fleet.run.task": preview(data.task), "fleet.run.sandbox": data.sandbox,
                "fleet.run.max_iters": data.max_iters,
                "fleet.run.max_llm_calls": data.max_llm_calls,
            }
        )  # fmt: skip
        b.runs[run] = span.span_id
        b.pending_runs.append((span.span_id, env.parent_run, data))
        return
    if run_span is None:  # a run's event with no RunStarted before it: not in this trace
        return
    if isinstance(data, IterationPlanned):
        span = b.add(
            Span(b.span_id("iteration", run, str(data.index)), run_span.span_id, "iteration",
                 f"iteration {data.index}", ts, end=ts)
        )  # fmt: skip
        span.attributes.update(
            {"fleet.iteration.index": data.index, "fleet.iteration.reasoning":
             preview(data.reasoning), "fleet.iteration.code": preview(data.code)}
        )  # fmt: skip
        if data.tool:
            span.attributes["fleet.iteration.tool"] = data.tool
        b.iterations[(run, data.index)] = span.span_id
        if data.llm_call:
            b.planning[data.llm_call] = span.span_id
    elif isinstance(data, LlmCalled):
        start = ts - timedelta(milliseconds=data.latency_ms)
        span = b.add(
            Span(b.span_id("llm", env.id), run_span.span_id, "llm", f"chat {data.model}", start,
                 end=ts, status="error" if data.error else "ok", error=data.error)
        )  # fmt: skip
        span.tokens_in, span.tokens_out = data.prompt_tokens, data.completion_tokens
        span.cost, span.llm_calls = data.cost, 1
        span.attributes.update(
            {"fleet.llm.role": data.role, "fleet.llm.request_kind": data.request_kind,
             "fleet.llm.call_id": data.call_id, "fleet.llm.cached": data.cached,
             "fleet.llm.recorded": data.recorded, "fleet.llm.model": data.model}
        )  # fmt: skip
        if isinstance(data.response, str):
            span.attributes["fleet.llm.response"] = preview(data.response)
        b.llm.append((span.span_id, run, data))
    elif isinstance(data, CellExecuted):
        start = ts - timedelta(milliseconds=data.duration_ms)
        span = b.add(
            Span(b.span_id("cell", run, data.cell_id or env.id), run_span.span_id, "cell",
                 "execute_tool code_cell", start, end=ts,
                 status="error" if data.error else "ok", error=data.error)
        )  # fmt: skip
        span.attributes.update(
            {"fleet.cell.id": data.cell_id, "fleet.cell.code": preview(data.code),
             "fleet.cell.stdout": preview(data.stdout), "fleet.cell.context": data.context,
             "fleet.cell.sandbox": data.sandbox, "fleet.cell.submitted": data.final is not None}
        )  # fmt: skip
        if data.cell_id:
            b.cells[(run, data.cell_id)] = span.span_id
        b.pending_cells.append((span.span_id, run, data))
    elif isinstance(data, ToolCalled):
        span = b.add(
            Span(b.span_id("tool", run, data.call_id), run_span.span_id, "tool",
                 f"execute_tool {data.tool}", ts)
        )  # fmt: skip
        span.status = "open"
        span.attributes.update(
            {"fleet.tool.name": data.tool, "fleet.tool.call_id": data.call_id,
             "fleet.tool.source": data.source, "fleet.tool.args": preview(data.args)}
        )  # fmt: skip
        if data.cell:
            span.attributes["fleet.tool.cell"] = data.cell
        b.tools[(run, data.call_id)] = span.span_id
        b.tool_calls.setdefault(data.call_id, span.span_id)
    elif isinstance(data, ToolReturned):
        tool = b.spans.get(b.tools.get((run, data.call_id), ""))
        if tool is not None:
            _run_end(tool, ts, "error" if data.error else "ok", data.error)
            if data.error == "":
                tool.attributes["fleet.tool.result"] = preview(data.result)
    elif isinstance(data, ChildRunRequested):
        b.children[data.child_run] = data
        b.child_failed.pop(data.child_run, None)
    elif isinstance(data, ChildRunFailed):
        b.child_failed[data.child_run] = (ts, data)
    elif isinstance(data, Escalated | FellBack):
        what = "escalated" if isinstance(data, Escalated) else "fell_back"
        run_span.attributes[f"fleet.run.{what}"] = f"{data.from_module}->{data.to_module}"
    elif isinstance(data, RunCompleted):
        _run_end(run_span, ts, "ok", "")
        run_span.attributes.update(
            {"fleet.run.answer": preview(data.answer), "fleet.run.iterations": data.iterations}
        )
    elif isinstance(data, RunFailed):
        _run_end(run_span, ts, "error", data.error)
    elif isinstance(data, RunCancelled):
        _run_end(run_span, ts, "error", f"cancelled: {data.reason}".rstrip(": "))


def _place(b: _Builder, turn_span: Span) -> None:
    """Parents decided once everything is read: a call is recorded before the iteration or
    cell it belongs to ends (and so before that is known)."""
    for span_id, run, event in b.llm:
        span = b.spans[span_id]
        if event.cell and (run, event.cell) in b.cells:
            span.parent_id = b.cells[(run, event.cell)]
        elif event.call_id in b.planning:
            span.parent_id = b.planning[event.call_id]
    for span_id, run, cell in b.pending_cells:
        if cell.iteration is not None and (run, cell.iteration) in b.iterations:
            b.spans[span_id].parent_id = b.iterations[(run, cell.iteration)]
    for (run, _), span_id in b.tools.items():  # host tool calls made by a cell hang under it
        span = b.spans[span_id]
        cell_id = span.attributes.get("fleet.tool.cell")
        if isinstance(cell_id, str) and (run, cell_id) in b.cells:
            span.parent_id = b.cells[(run, cell_id)]
    for span_id, parent_run, started in b.pending_runs:
        span = b.spans[span_id]
        if parent_run is None or parent_run not in b.runs:
            span.parent_id = turn_span.span_id
        else:
            span.parent_id = b.tool_calls.get(started.parent_call, b.runs[parent_run])
    for child, (ts, failed) in b.child_failed.items():  # children that never got to start
        if child in b.runs:
            continue
        asked = b.children.get(child)
        span = b.add(
            Span(b.span_id("child", child), b.tool_calls.get(failed.call_id, turn_span.span_id),
                 "child", "invoke_agent child", ts, end=ts, status="error",
                 error=failed.error)
        )  # fmt: skip
        span.attributes.update({"fleet.run.id": child, "fleet.child.never_started": True})
        if asked is not None:
            span.attributes["fleet.run.task"] = preview(asked.task)
    iterations = set(b.iterations.values())
    for kid in list(b.spans.values()):  # an iteration: from its planning call to its cell's end
        if kid.parent_id in iterations:
            span = b.spans[kid.parent_id]
            span.start = min(span.start, kid.start)
            span.end = max(span.end or span.start, kid.end or kid.start)


def _ordered(b: _Builder, turn_span: Span) -> list[Span]:
    by_parent: dict[str | None, list[Span]] = {}
    for span in b.spans.values():
        by_parent.setdefault(span.parent_id, []).append(span)
    out: list[Span] = []
    stack = [turn_span]
    while stack:
        span = stack.pop()
        out.append(span)
        kids = sorted(by_parent.get(span.span_id, []), key=lambda s: (s.start, s.span_id))
        stack.extend(reversed(kids))
    return out


def _totals(spans: list[Span]) -> None:
    """Tokens, cost and calls of each span's subtree (children come after their parent)."""
    index = {s.span_id: s for s in spans}
    for span in reversed(spans):
        parent = index.get(span.parent_id or "")
        if parent is not None:
            parent.tokens_in += span.tokens_in
            parent.tokens_out += span.tokens_out
            parent.cost += span.cost
            parent.llm_calls += span.llm_calls
