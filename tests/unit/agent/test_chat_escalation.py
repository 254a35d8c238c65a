"""The chat agent's escalation rule and fallbacks, as pure decisions."""

import pytest

from fleet_agent.chat.escalation import (
    CONTEXT_THRESHOLD,
    UnknownMode,
    after_cot,
    check_mode,
    context_chars,
    during_react,
    fallback_from,
    fallback_note,
    opening,
)


def test_rlm_only_opens_at_the_rlm_whatever_the_message() -> None:
    move = opening("rlm_only", 10, "hello", CONTEXT_THRESHOLD)
    assert move is not None
    assert (move.from_module, move.to_module, move.rule) == ("cot", "rlm", "rlm_only")


def test_the_threshold_is_exclusive_and_tools_only_ignores_it() -> None:
    assert opening("auto", CONTEXT_THRESHOLD, "hello", CONTEXT_THRESHOLD) is None
    over = opening("auto", CONTEXT_THRESHOLD + 1, "hello", CONTEXT_THRESHOLD)
    assert over is not None
    assert (over.to_module, over.rule) == ("rlm", "context_over_threshold")
    assert opening("tools_only", CONTEXT_THRESHOLD + 1, "hello", CONTEXT_THRESHOLD) is None


@pytest.mark.parametrize(
    "message",
    [
        "summarise the attached document",
        "what is in notes.txt? read the file",
        "remember that I like tea (memory)",
        "load https://example.com/page",
        "grep the logs for errors",
    ],
)
def test_a_message_naming_what_only_tools_reach_opens_at_react(message: str) -> None:
    move = opening("auto", len(message), message, CONTEXT_THRESHOLD)
    assert move is not None
    assert (move.to_module, move.rule) == ("react", "tools_needed")
    assert "the message mentions" in move.detail


def test_a_plain_message_opens_at_chain_of_thought() -> None:
    assert opening("auto", 20, "what is two plus two?", CONTEXT_THRESHOLD) is None
    assert opening("tools_only", 20, "what is two plus two?", CONTEXT_THRESHOLD) is None


def test_cot_escalates_on_its_own_flag_or_the_marker_only() -> None:
    assert after_cot(False, "I can answer this") is None
    flagged = after_cot(True, "")
    assert flagged is not None
    assert flagged.detail == "ChainOfThought answered needs_tools=True"
    marked = after_cot(False, "I need the file [TOOLS NEEDED]")
    assert marked is not None
    assert "[TOOLS NEEDED]" in marked.detail


def test_fallbacks_go_down_one_module_and_stop_at_cot() -> None:
    assert fallback_from("rlm", "auto") == "react"
    assert fallback_from("react", "auto") == "cot"
    assert fallback_from("react", "tools_only") == "cot"
    assert fallback_from("cot", "auto") is None
    assert fallback_from("cot", "auto", context_in_sandbox=True) is None


def test_rlm_only_is_a_contract_nothing_else_answers() -> None:
    for module in ("rlm", "react", "cot"):
        assert fallback_from(module, "rlm_only") is None
        assert fallback_from(module, "rlm_only", context_in_sandbox=True) is None


def test_chain_of_thought_is_no_fallback_for_context_only_tools_reach() -> None:
    assert fallback_from("react", "auto", context_in_sandbox=True) is None
    assert fallback_from("react", "tools_only", context_in_sandbox=True) is None
    # ReAct has the tools: it can read what the RLM could
    assert fallback_from("rlm", "auto", context_in_sandbox=True) == "react"


def test_the_fallback_line_names_both_modules_and_cuts_the_reason_at_a_word() -> None:
    assert fallback_note("rlm", "react", "timed out\n after  600 s") == (
        "answered by ReAct (the tools) after the RLM failed: timed out after 600 s"
    )
    long = ("word " * 200).strip()
    note = fallback_note("react", "cot", long)
    assert note.startswith("answered by chain of thought after ReAct (the tools) failed: word")
    assert note.endswith("word …")
    assert len(note) < 480
    assert fallback_note("x", "y", "why") == "answered by y after x failed: why"


def test_context_counts_message_memory_and_history() -> None:
    turns = [{"question": "ab", "answer": "cde"}]
    assert context_chars("xyz", turns, "mm") == 3 + 2 + 5


def test_an_unknown_mode_is_named_with_the_modes_there_are() -> None:
    assert check_mode("tools_only") == "tools_only"
    with pytest.raises(UnknownMode) as refused:
        check_mode("turbo")
    assert "'turbo'" in str(refused.value)
    assert "auto, rlm_only, tools_only" in str(refused.value)


def test_react_climbs_to_the_rlm_only_past_the_threshold_and_not_under_tools_only() -> None:
    assert during_react("auto", 1_000, 1_000) is None
    up = during_react("auto", 1_001, 1_000)
    assert up is not None
    assert (up.from_module, up.to_module, up.rule) == ("react", "rlm", "context_over_threshold")
    assert up.detail == (
        "ReAct's trajectory brought the context to 1001 characters, over the threshold of 1000"
    )
    assert during_react("tools_only", 10**6, 1_000) is None
