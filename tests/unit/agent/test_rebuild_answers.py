"""Issue 29: how a rebuilt REPL context's host calls are answered (`RecordingInterpreter`).
A kept cell's replay is answered only from what the first run got, in order: a call it did
not make then is refused and marks the replay diverged, and nothing is ever asked live (a
model call paid twice, a tool run twice). The interrupted cell, run again, gets its calls made
before the loss answered as before, and from the first call that goes another way on, live."""

from collections import deque
from typing import Any

from fleet_agent.engine.interpreting import RecordingInterpreter
from fleet_events import sandbox as sb


def interpreter(live: list[str]) -> RecordingInterpreter:
    repl = RecordingInterpreter(bus=None, sandbox="s", hooks=None, context="c")  # type: ignore[arg-type]

    def live_tool(call: sb.ToolCall) -> sb.ToolReply:
        live.append(call.name)
        return sb.ToolReply(ok=True, value=f"live {call.name}")

    repl._live_tool = live_tool  # type: ignore[method-assign]
    return repl


def call(name: str) -> sb.ToolCall:
    return sb.ToolCall(request_id="r", sandbox="s", context="c", name=name)


def kept(*names: str) -> deque[tuple[str, sb.ToolReply]]:
    return deque((n, sb.ToolReply(ok=True, value=f"kept {n}")) for n in names)


def test_a_replay_is_answered_from_memory_and_never_asks_live() -> None:
    live: list[str] = []
    repl = interpreter(live)
    repl._replaying, repl._answers = True, kept("llm_query", "sub_rlm")
    got: list[Any] = [repl._on_tool(call("llm_query")).value, repl._on_tool(call("sub_rlm")).value]
    assert got == ["kept llm_query", "kept sub_rlm"]
    assert repl._diverged == ""
    extra = repl._on_tool(call("llm_query"))  # one more than the first run made
    assert not extra.ok
    assert "replay diverged" in extra.error
    assert repl._diverged == "it called llm_query() where the first run called nothing more"
    assert live == []


def test_a_replay_calling_another_tool_diverges_and_stays_off_the_host() -> None:
    live: list[str] = []
    repl = interpreter(live)
    repl._replaying, repl._answers = True, kept("llm_query")
    refused = repl._on_tool(call("sub_rlm"))
    assert not refused.ok
    assert repl._diverged == "it called sub_rlm() where the first run called llm_query()"
    assert live == []


def test_the_interrupted_cell_reuses_its_answered_prefix_then_goes_live() -> None:
    live: list[str] = []
    repl = interpreter(live)
    repl._answers = kept("llm_query", "sub_rlm", "llm_query")
    assert repl._on_tool(call("llm_query")).value == "kept llm_query"
    assert repl._on_tool(call("lookup")).value == "live lookup"  # it went another way
    assert repl._on_tool(call("sub_rlm")).value == "live sub_rlm"  # not the kept answer
    assert live == ["lookup", "sub_rlm"]
    assert [n for n, _ in repl._calls] == ["llm_query", "lookup", "sub_rlm"]  # kept again
