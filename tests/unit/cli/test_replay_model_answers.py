"""`fleet replay` answers a cell's `llm_query` as the live run was answered: the recorded
response, the retry's answer where a rate-limited attempt was asked again, and a recorded
failure in the words the cell saw."""

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from fleet_cli.replay import RunRecord, SessionRecord, _Answers
from fleet_events import journal as jr
from fleet_events import sandbox as sb
from fleet_events.run import ChatMessage, LlmCalled

CELL = "r-c1"


def call(index: int, prompt: str, **fields: Any) -> LlmCalled:
    return LlmCalled(
        role="delegate", model="m", call_id=f"r-l{index}", index=index, request_kind="sub",
        cell=CELL, messages=[ChatMessage(role="user", content=prompt)], **fields,
    )  # fmt: skip


def answers(*calls: LlmCalled) -> _Answers:
    record = SessionRecord({}, {})
    run = RunRecord("r", "t", "s", None, "turn", jr.Journal(), list(calls))
    answering = _Answers(cast(Any, SimpleNamespace(record=record)), run, "sandbox", 0)
    answering.cell = CELL
    return answering


def ask(answering: _Answers, name: str, *args: Any) -> sb.ToolReply:
    tool = sb.ToolCall(request_id="q", sandbox="sandbox", context="c", name=name, args=list(args))
    return asyncio.run(answering.answer(tool))


def test_a_rate_limited_attempt_is_passed_over_for_its_retrys_answer() -> None:
    limited = call(1, "hi", error="RateLimitError", error_code="llm_rate_limited", retry_in_s=1.0)
    reply = ask(answers(limited, call(2, "hi", response="hello")), "llm_query", "hi")
    assert (reply.ok, reply.value) == (True, "hello")


def test_a_failed_call_fails_again_with_the_words_the_cell_saw() -> None:
    shown = "llm_auth_failed: the provider refused the key (the provider said: AuthError)"
    failed = call(1, "hi", error="AuthError", error_code="llm_auth_failed", error_shown=shown)
    reply = ask(answers(failed), "llm_query", "hi")
    assert (reply.ok, reply.error) == (False, f"LmCallFailed: {shown}")


def test_a_failed_prompt_of_a_batch_is_an_error_string_in_its_place() -> None:
    shown = "llm_unavailable: the server failed, HTTP 500"
    calls = (call(1, "a", response="A"), call(2, "b", error="x", error_shown=shown))
    reply = ask(answers(*calls), "llm_query_batched", ["a", "b"])
    assert (reply.ok, reply.value) == (True, ["A", f"[ERROR] {shown}"])
