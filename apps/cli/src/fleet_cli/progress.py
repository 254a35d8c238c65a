"""One line per event for the terminal (`fleet run`'s stderr, `fleet chat`): the event's type,
and for the steps a person follows live what they did: a code cell's first line and what it
printed or raised, a tool call, a child run asked for and how it ended. Pure."""

import json
from typing import Any

from fleet_events.bus import CALL_STARTED_DELTA, MODEL_WAITING_DELTA

WIDTH = 100


def _first_line(value: object, width: int = WIDTH) -> str:
    text = str(value or "").strip()
    line = text.splitlines()[0] if text else ""
    return line[:width] + ("…" if len(line) > width or "\n" in text else "")


def describe(frame: dict[str, Any]) -> str:
    """`· TYPE` plus what the step did, for an `event` frame (empty for any other frame)."""
    if frame.get("type") != "event":
        return ""
    envelope = frame.get("event") or {}
    data = envelope.get("data") or {}
    kind = str(data.get("type"))
    run = str(envelope.get("run") or "")[:12]
    match kind:
        case "run.cell_executed" if data.get("setup"):
            return f"· sandbox set up [{run}] (the framework's code, not the model's)"
        case "run.cell_executed":
            outcome = (
                f"error: {_first_line(data.get('error'), 60)}"
                if data.get("error")
                else _first_line(data.get("stdout"), 60) or "no output"
            )
            return f"· cell [{run}] {_first_line(data.get('code'), 60)} → {outcome}"
        case "run.tool_called":
            return f"· tool [{run}] {data.get('tool')}"
        case "run.child_requested":
            child = str(data.get("child_run") or "")[:12]
            depth = data.get("depth", 0)
            return f"· child run {child} (depth {depth}): {_first_line(data.get('task'))}"
        case "run.child_completed":
            child = str(data.get("child_run") or "")[:12]
            return f"· child run {child} answered: {_first_line(data.get('answer'))}"
        case "run.child_failed":
            child = str(data.get("child_run") or "")[:12]
            return f"· child run {child} failed: {_first_line(data.get('error'))}"
        case "run.escalated":
            moved = f"{data.get('from_module')} → {data.get('to_module')}"
            return f"· {kind}: {moved} ({data.get('rule')})"
    return f"· {kind}"


def delta_line(frame: dict[str, Any]) -> str:
    """A line of its own for a delta a person follows apart from the answer's text: a model
    call in flight (`llm_call_started`), a call waiting for the embedded model to come up
    (`model_waiting`); empty for any other frame (the answer's tokens, a cell's output)."""
    if frame.get("type") != "delta":
        return ""
    run = str(frame.get("run") or "")[:12]
    if frame.get("kind") == MODEL_WAITING_DELTA:
        return f"· [{run}] {_first_line(frame.get('text'), 200)}"
    if frame.get("kind") != CALL_STARTED_DELTA:
        return ""
    try:
        call = json.loads(str(frame.get("text") or ""))
    except ValueError:
        call = {}
    if not isinstance(call, dict):
        call = {}
    return f"· model call [{run}] {call.get('role', '?')} · {call.get('model', '?')} in flight"
