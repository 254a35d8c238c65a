"""The progress line of each event: what a code cell, a tool and a child run did, in one line."""

from typing import Any

from fleet_cli.progress import delta_line, describe


def event(run: str = "run-abcdefghijklmnop", **data: Any) -> dict[str, Any]:
    return {"type": "event", "seq": 1, "event": {"run": run, "data": data}}


def test_a_cell_shows_its_first_line_and_what_it_printed_or_raised() -> None:
    ran = event(type="run.cell_executed", code="x = 6 * 7\nprint(x)", stdout="42\n")
    assert describe(ran) == "· cell [run-abcdefgh] x = 6 * 7… → 42"
    failed = event(type="run.cell_executed", code="1/0", error="ZeroDivisionError: division")
    assert describe(failed) == "· cell [run-abcdefgh] 1/0 → error: ZeroDivisionError: division"
    silent = event(type="run.cell_executed", code="y = 1")
    assert describe(silent).endswith("→ no output")


def test_child_runs_and_tools_are_named_with_their_task_and_ending() -> None:
    asked = event(type="run.child_requested", child_run="c1", task="sum the\ncolumn", depth=2)
    assert describe(asked) == "· child run c1 (depth 2): sum the…"
    assert describe(event(type="run.child_completed", child_run="c1", answer="10")) == (
        "· child run c1 answered: 10"
    )
    assert describe(event(type="run.child_failed", child_run="c1", error="budget")) == (
        "· child run c1 failed: budget"
    )
    assert describe(event(type="run.tool_called", tool="load_document")) == (
        "· tool [run-abcdefgh] load_document"
    )
    moved = event(type="run.escalated", from_module="cot", to_module="rlm", rule="rlm_only")
    assert describe(moved) == "· run.escalated: cot → rlm (rlm_only)"


def test_other_events_are_their_type_and_other_frames_nothing() -> None:
    assert describe(event(type="turn.started")) == "· turn.started"
    assert describe({"type": "delta", "text": "hi"}) == ""
    long = event(type="run.child_completed", child_run="c", answer="a" * 300)
    assert describe(long) == "· child run c answered: " + "a" * 100 + "…"


def test_the_frameworks_set_up_code_is_not_shown_as_a_cell_the_model_wrote() -> None:
    setup = event(
        type="run.cell_executed", code='"""Sandbox side of the dspy facade"""', setup=True
    )
    assert (
        describe(setup) == "· sandbox set up [run-abcdefgh] (the framework's code, not the model's)"
    )


def test_a_model_call_in_flight_is_a_line_of_its_own_and_other_deltas_are_not() -> None:
    text = '{"grant": "r1-g3", "role": "planner", "model": "openai/qwen"}'
    started = {"type": "delta", "kind": "llm_call_started", "run": "run-abcdefghijklmnop",
               "text": text}  # fmt: skip
    assert delta_line(started) == "· model call [run-abcdefgh] planner · openai/qwen in flight"
    garbled = {**started, "text": "not json"}
    assert delta_line(garbled) == "· model call [run-abcdefgh] ? · ? in flight"
    token = {"type": "delta", "kind": "assistant_token", "run": None, "text": "Par"}
    assert delta_line(token) == ""  # the answer's own text stays the answer's
    assert delta_line(event(type="run.llm_called")) == ""
    waiting = {"type": "delta", "kind": "model_waiting", "run": "run-abcdefghijklmnop",
               "text": "waiting for the local model: building: qwen, ~9 min left"}  # fmt: skip
    assert delta_line(waiting) == (
        "· [run-abcdefgh] waiting for the local model: building: qwen, ~9 min left"
    )
