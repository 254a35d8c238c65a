"""The budgeted engine's pure parts: the profile's limits win, keys are scrubbed from text."""

from dspy.lm15 import Config, Message, Request

from fleet_agent.lm import NO_KEY, BudgetSpent, _messages, _with_profile_limits, scrub
from fleet_events.llm import LlmProfile


def request(**config: object) -> Request:
    return Request(
        model="openai/x",
        system="be brief",
        messages=(Message.user("hi"),),
        config=Config(**config),
    )


def test_the_profile_caps_max_tokens_and_fills_temperature() -> None:
    profile = LlmProfile(name="p", model="openai/x", max_tokens=100, temperature=0.0)
    capped = _with_profile_limits(request(max_tokens=5000), profile)
    assert (capped.config.max_tokens, capped.config.temperature) == (100, 0.0)
    kept = _with_profile_limits(request(max_tokens=50, temperature=0.7), profile)
    assert (kept.config.max_tokens, kept.config.temperature) == (50, 0.7)
    plain = LlmProfile(name="p", model="openai/x")
    untouched = request()
    assert _with_profile_limits(untouched, plain) is untouched


def test_messages_are_recorded_as_sent() -> None:
    messages, params = _messages(request(max_tokens=7))
    assert [(m.role, m.content) for m in messages] == [("system", "be brief"), ("user", "hi")]
    assert params.get("max_tokens") == 7 or params.get("max_completion_tokens") == 7


def test_scrub_removes_the_key_and_leaves_the_rest() -> None:
    key = "sk-live-abcdef123456"
    assert scrub(f"401: key {key} is wrong ({key})", key) == "401: key *** is wrong (***)"
    assert scrub("nothing to hide", key) == "nothing to hide"
    assert scrub("unused stays", NO_KEY) == "unused stays"


def test_a_refusal_reads_as_the_budget_message() -> None:
    assert str(BudgetSpent("budget spent: 0 of 5 calls left")) == "budget spent: 0 of 5 calls left"
