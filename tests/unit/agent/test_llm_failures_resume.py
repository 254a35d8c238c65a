"""A resumed run answers its model calls from the record as the live run was answered: a
rate-limited attempt the LM asked again is passed over for the retry's answer, a failure
that ended the call fails again with its recorded kind, and every recorded call's usage is
reported again (the live run did not wait for it)."""

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from dspy.lm15 import Message, Request, Response

from fleet_agent.engine.journal_lm import JournalEngine
from fleet_agent.engine.recorder import RunRecorder
from fleet_agent.engine.resume import Resume
from fleet_agent.lm import BudgetedEngine, CallScope, LmCallFailed, _messages, _with_profile_limits
from fleet_events import journal as jr
from fleet_events.budget import RecordUsage
from fleet_events.llm import LlmProfile
from fleet_events.run import LlmCalled, request_digest
from fleet_mesh.runtime_config import StoredProfile

PROFILE = LlmProfile(name="main", model="openai/scripted", secret="llm-main")
SCOPE = CallScope(tenant="t", tree="tr", run="r", role="planner", kind="step")
REQUEST = Request(model="openai/fleet-planner", messages=(Message.user("count to three"),))


class Loop:
    def run(self, work: Coroutine[Any, Any, Any], *, timeout: float) -> Any:
        return asyncio.run(work)


@dataclass
class LiveLM:
    """Stands in for the budgeted LM behind the journal: the profile, and live calls counted."""

    live: list[Request] = field(default_factory=list)
    runner: Loop = field(default_factory=Loop)
    scope: CallScope = field(default_factory=lambda: SCOPE)
    reports: list[RecordUsage] = field(default_factory=list)

    def report(self, usage: RecordUsage) -> None:
        self.reports.append(usage)

    async def _resolve(self) -> tuple[StoredProfile, str]:
        return StoredProfile(profile=PROFILE, tenant="t", revision=1), "unused"

    def complete(self, request: Request, *, retries_made: int = 0) -> Response:
        self.live.append(request)
        raise AssertionError("a recorded call went to the model")


@dataclass
class Reused:
    ids: list[str] = field(default_factory=list)

    def reused_call(self, call_id: str, kind: str) -> None:
        self.ids.append(call_id)


def recorded(index: int, **fields: Any) -> LlmCalled:
    messages, params = _messages(_with_profile_limits(REQUEST, PROFILE))
    return LlmCalled(
        role="planner", model=PROFILE.model, call_id=f"r-l{index}", index=index,
        request_kind="step", messages=messages, params=params,
        request_hash=request_digest(PROFILE.model, messages, params), **fields,
    )  # fmt: skip


def engine(*events: LlmCalled) -> tuple[JournalEngine, LiveLM, Reused]:
    journal = jr.Journal()
    for event in events:
        jr.evolve(journal, event)
    live, reused = LiveLM(), Reused()
    resume = Resume(cast(Any, None), journal)  # inline responses: no blob is read
    journal_engine = JournalEngine(cast(BudgetedEngine, live), resume, cast(RunRecorder, reused))
    return journal_engine, live, reused


def test_a_retried_rate_limit_is_passed_over_for_the_retrys_answer() -> None:
    limited = recorded(
        1, error="RateLimitError: slow down", error_code="llm_rate_limited", retry_in_s=1.0
    )
    journal_engine, live, reused = engine(limited, recorded(2, response="three"))
    response = journal_engine.complete(REQUEST)
    assert "".join(getattr(p, "text", "") for p in response.message.parts) == "three"
    assert reused.ids == ["r-l1", "r-l2"]
    assert live.live == []


def test_a_failure_that_ended_the_call_fails_again_with_its_kind() -> None:
    refused = recorded(1, error="AuthError: Incorrect API key provided: ***",
                       error_code="llm_auth_failed")  # fmt: skip
    journal_engine, _, _ = engine(refused)
    with pytest.raises(LmCallFailed) as caught:
        journal_engine.complete(REQUEST)
    assert caught.value.failure is not None
    assert caught.value.failure.code == "llm_auth_failed"
    assert str(caught.value).startswith(
        "llm_auth_failed: the provider refused the key for the model 'openai/scripted' of "
        "profile 'main' (role planner): check the api_key of profile 'main' (its secret "
        "'llm-main')"
    )


def test_a_failure_recorded_before_kinds_existed_fails_as_it_did() -> None:
    journal_engine, _, _ = engine(recorded(1, error="LmCallFailed: down"))
    with pytest.raises(LmCallFailed) as caught:
        journal_engine.complete(REQUEST)
    assert caught.value.failure is None
    assert str(caught.value) == "LmCallFailed: down"


def test_a_retry_the_dead_holder_never_made_is_made_live() -> None:
    limited = recorded(1, error="RateLimitError", error_code="llm_rate_limited", retry_in_s=1.0)
    journal_engine, live, reused = engine(limited)
    with pytest.raises(AssertionError, match="a recorded call went to the model"):
        journal_engine.complete(REQUEST)
    assert reused.ids == ["r-l1"]
    assert len(live.live) == 1


def test_each_recorded_call_reports_its_usage_again_under_its_own_id() -> None:
    """The live run handed the answer on with its usage report in flight: a replica that died
    then may have taken the report with it, so the resumed run sends it again, as recorded
    (the budget answers a report it holds by its id, so nothing counts twice)."""
    limited = recorded(
        1, error="RateLimitError", error_code="llm_rate_limited", retry_in_s=1.0,
        grant_id="r-g1", prompt_tokens=7,
    )  # fmt: skip
    answered = recorded(
        2, response="three", grant_id="r-g2", prompt_tokens=7, completion_tokens=3, cost=0.25
    )
    journal_engine, live, _ = engine(limited, answered)
    journal_engine.complete(REQUEST)
    assert [(u.request_id, u.prompt_tokens, u.completion_tokens, u.cost) for u in live.reports] == [
        ("r-g1-usage", 7, 0, 0.0), ("r-g2-usage", 7, 3, 0.25),
    ]  # fmt: skip
    assert {(u.tree, u.run, u.role, u.model) for u in live.reports} == {
        ("tr", "r", "planner", PROFILE.model)
    }


def test_a_resumed_failure_says_what_the_live_one_said() -> None:
    """The words of a failure name its HTTP status and the provider's Retry-After: a cell
    printing the error, and a replay comparing that output, must see the same text resumed."""
    limited = recorded(
        1, error="RateLimitError: slow down", error_code="llm_rate_limited",
        http_status=429, retry_after_s=30.0,
    )  # fmt: skip
    journal_engine, _, _ = engine(limited)
    with pytest.raises(LmCallFailed) as caught:
        journal_engine.complete(REQUEST)
    assert "retry after 30 s" in str(caught.value)
    refused = recorded(1, error="AuthError", error_code="llm_auth_failed", http_status=401)
    journal_engine, _, _ = engine(refused)
    with pytest.raises(LmCallFailed) as caught:
        journal_engine.complete(REQUEST)
    assert "(role planner), HTTP 401:" in str(caught.value)


@dataclass
class CountingLM(LiveLM):
    retries: list[int] = field(default_factory=list)

    def complete(self, request: Request, *, retries_made: int = 0) -> Response:
        self.retries.append(retries_made)
        raise AssertionError("a recorded call went to the model")


def test_retries_made_before_a_resume_count_against_the_retry_limit() -> None:
    """Two rate-limited attempts were asked again before the holder died: the live call made
    on resume is told so, and may not start the retry count from zero."""
    first = recorded(1, error="RateLimitError", error_code="llm_rate_limited", retry_in_s=1.0)
    second = recorded(2, error="RateLimitError", error_code="llm_rate_limited", retry_in_s=1.0)
    journal = jr.Journal()
    for event in (first, second):
        jr.evolve(journal, event)
    live = CountingLM()
    resume = Resume(cast(Any, None), journal)
    journal_engine = JournalEngine(cast(BudgetedEngine, live), resume, cast(RunRecorder, Reused()))
    with pytest.raises(AssertionError, match="a recorded call went to the model"):
        journal_engine.complete(REQUEST)
    assert live.retries == [2]
