"""The budgeted LM's wire to a server of each kind, against a real budget replica and the
scripted LM (a FAKE model server): what a llama.cpp profile sends (the limit in `max_tokens`,
the seed, a grammar of the adapter's fields), and the answer streamed to `on_delta` while the
recorded call holds the whole response."""

import json
import os
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
import pytest

from fleet_agent.lm import ANSWER_DELTA, BudgetSpent, CallScope, budgeted_lm
from fleet_events import new_id
from fleet_events.bus import CALL_STARTED_DELTA
from fleet_events.run import LlmCalled
from fleet_harness.scripted_lm import Reply, ScriptedLM
from fleet_harness.waits import eventually_sync

from ..agent.test_lm_budget import (
    ADAPTER,
    Tenant,
    budget_replica,
    fields,
    line,
    private_key,
    services,
    tenant,
)

__all__ = ["budget_replica", "line", "private_key", "services", "tenant"]

# litellm's streaming path builds its `Delta` model on first use and copies chunk attributes
# off instances; pydantic warns at both (ReadOnly TypedDict items of litellm's own types, and
# instance access to `model_fields`): nothing a streamed call can avoid.
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:Item '\\w+' on TypedDict class 'ChatCompletion\\w+' is using the `ReadOnly`"
        ":UserWarning"
    ),
    pytest.mark.filterwarnings(
        "ignore:Accessing the 'model_\\w*fields' attribute on the instance:DeprecationWarning"
    ),
]

ANSWER = "Paris is the capital; it has been since [987] or so."
REPLY = fields(reasoning="a known fact", answer=ANSWER)


def streaming_lm(tenant: Tenant, tree: str) -> tuple[Any, list[LlmCalled], list[tuple[str, str]]]:
    calls: list[LlmCalled] = []
    deltas: list[tuple[str, str]] = []
    scope = CallScope(tenant=tenant.id, tree=tree, run=new_id(), role="planner", kind="step")
    lm = budgeted_lm(
        tenant.line,
        tenant.services,
        scope,
        on_call=calls.append,
        on_delta=lambda kind, text: deltas.append((kind, text)),
    )
    return lm, calls, deltas


def test_a_llama_cpp_profile_sends_max_tokens_the_seed_and_a_grammar(tenant: Tenant) -> None:
    with ScriptedLM([REPLY, REPLY]) as fake:
        tenant.profile(
            model="openai/scripted", api_base=fake.base_url, server_kind="llama.cpp",
            max_tokens=64, temperature=0.0, seed=11,
        )  # fmt: skip
        tree = tenant.open_tree(max_llm_calls=4)
        lm, calls = tenant.lm(tree)
        with dspy.context(lm=lm, adapter=ADAPTER):
            answer = dspy.ChainOfThought("question -> answer")(question="Capital of France?")
        sent = fake.requests[-1].body
        tenant.profile(model="openai/scripted", api_base=fake.base_url, max_tokens=64)
        lm, _ = tenant.lm(tree)
        with dspy.context(lm=lm, adapter=ADAPTER):
            dspy.ChainOfThought("question -> answer")(question="Capital of France?")
        generic = fake.requests[-1].body
    assert answer.answer == ANSWER
    assert sent["max_tokens"] == 64
    assert "max_completion_tokens" not in sent  # llama-cpp-python ignores it
    assert (sent["seed"], sent["temperature"]) == (11, 0.0)
    assert sent["grammar"].startswith('root ::= f0 "\\n\\n" f1 "\\n\\n[[ ## completed ## ]]"')
    assert '"[[ ## answer ## ]]\\n"' in sent["grammar"]
    (call,) = calls
    assert call.params["max_tokens"] == 64  # the record shows what was sent
    assert "grammar" in call.params
    assert generic["max_completion_tokens"] == 64  # a generic server gets dspy's request
    assert not {"max_tokens", "grammar", "seed"} & set(generic)


def test_the_answer_streams_to_on_delta_and_the_record_holds_the_whole_reply(
    tenant: Tenant,
) -> None:
    with ScriptedLM([Reply(REPLY, completion_tokens=21, prompt_tokens=99)]) as fake:
        tenant.profile(model="openai/scripted", api_base=fake.base_url)
        tree = tenant.open_tree(max_llm_calls=2)
        lm, calls, deltas = streaming_lm(tenant, tree)
        with dspy.context(lm=lm, adapter=ADAPTER):
            answer = dspy.ChainOfThought("question -> answer")(question="Capital of France?")
        streamed = fake.requests[-1].stream
    assert streamed
    assert answer.answer == ANSWER
    assert {kind for kind, _ in deltas} == {ANSWER_DELTA}
    assert "".join(text for _, text in deltas) == ANSWER
    assert len(deltas) > 3  # token by token, not one piece at the end
    (call,) = calls
    assert call.response == REPLY  # the persisted call carries the whole response
    assert (call.prompt_tokens, call.completion_tokens) == (99, 21)  # the stream's usage chunk
    status = tenant.status(tree)
    assert (status.calls_recorded, status.tokens_used) == (1, 120)


def test_a_granted_call_is_announced_before_it_is_sent_and_a_refused_one_is_not(
    tenant: Tenant,
) -> None:
    seen: list[tuple[str, Any]] = []
    with ScriptedLM(["first", "second"]) as fake:
        tenant.profile("delegate", model="openai/scripted", api_base=fake.base_url)
        tree = tenant.open_tree(max_llm_calls=1)
        scope = CallScope(tenant=tenant.id, tree=tree, run=new_id(), role="delegate", kind="sub")
        lm = budgeted_lm(
            tenant.line, tenant.services, scope,
            on_call=lambda call: seen.append(("stored", call)),
            announce=lambda kind, text: seen.append((kind, json.loads(text))),
        )  # fmt: skip
        assert lm("the first question") == ["first"]
        with pytest.raises(BudgetSpent):  # the tree's one call is spent: nothing is sent
            lm("the second question")
        sent = len(fake.requests)
    (started, before), (stored, call) = seen
    assert (started, stored) == (CALL_STARTED_DELTA, "stored")  # announced, then recorded
    assert before == {"grant": call.grant_id, "role": "delegate", "model": "openai/scripted"}
    assert call.grant_id  # the stored call names the grant its announcement named
    assert sent == 1


def test_a_reply_without_an_answer_field_sends_no_delta(tenant: Tenant) -> None:
    with ScriptedLM(["just the text an llm_query gets"]) as fake:
        tenant.profile(model="openai/scripted", api_base=fake.base_url)
        tree = tenant.open_tree(max_llm_calls=2)
        lm, calls, deltas = streaming_lm(tenant, tree)
        text = lm("summarise this")
        streamed = fake.requests[-1].stream
    assert text == ["just the text an llm_query gets"]
    assert streamed  # every call streams, so the agent can bound it (the tests below)
    assert deltas == []
    assert len(calls) == 1


WORDS = " ".join(f"w{n}" for n in range(200))


def test_a_call_past_its_token_bound_is_cut_and_its_request_closed(tenant: Tenant) -> None:
    # the embedded llama.cpp server produced 694 to 2,158 tokens under a 512-token bound
    with ScriptedLM([Reply(WORDS, pace_s=0.01)]) as fake:
        tenant.profile(model="openai/scripted", api_base=fake.base_url, max_tokens=5)
        tree = tenant.open_tree(max_llm_calls=2)
        lm, calls, _ = streaming_lm(tenant, tree)
        with pytest.raises(Exception, match="bound of 5 output tokens"):
            lm("summarise this")
        eventually_ended(fake, 0)
        sent = fake.streamed[0]
    (call,) = calls
    assert call.error_code == "llm_error"
    assert "6 streamed" in call.error
    assert call.completion_tokens == 6  # what it generated is still counted
    assert sent < 200  # the server stopped: the request was closed, not read to its end


def test_a_call_past_its_timeout_stops_the_server_and_says_how_slow_it_was(
    tenant: Tenant,
) -> None:
    slow = Reply(WORDS, pace_s=0.05)  # 10 s to generate the whole reply
    with ScriptedLM([slow, "the next call's answer"]) as fake:
        tenant.profile(model="openai/scripted", api_base=fake.base_url, timeout_s=1.0)
        tree = tenant.open_tree(max_llm_calls=3)
        lm, calls, _ = streaming_lm(tenant, tree)
        with pytest.raises(Exception, match="timeout of 1 s"):
            lm("summarise this")
        eventually_ended(fake, 0)
        sent = fake.streamed[0]
        assert lm("and now?") == ["the next call's answer"]
    first, second = calls
    assert first.error_code == "llm_timeout"
    assert "tokens/s" in first.error
    assert "Raise timeout_s" in first.error
    assert 0 < sent < 200  # cut after about a second, not generated to its end
    assert second.error == ""
    assert second.latency_ms < 5_000  # the next call did not wait out the abandoned one


def eventually_ended(fake: ScriptedLM, index: int) -> None:
    """Bounded wait until the fake's stream `index` stopped generating (the client closed)."""
    eventually_sync(lambda: index in fake.streams_ended, timeout=10, what="the stream closed")
