"""The scripted LM (a FAKE: a model cannot be made to answer deterministically) speaks the wire
real OpenAI-compatible servers speak, to real `dspy.LM` clients, and holds calls at gates."""

import concurrent.futures
import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
import httpx
import pytest

from fleet_harness.scripted_lm import Reply, ScriptedLM, by_marker

ADAPTER = dspy.ChatAdapter(use_json_adapter_fallback=False)


def fields(**values: object) -> str:
    body = "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items())
    return body + "[[ ## completed ## ]]\n"


def client_lm(fake: ScriptedLM, key: str = "test-key") -> dspy.LM:
    return dspy.LM(
        "openai/scripted", api_base=fake.base_url, api_key=key, cache=False, num_retries=0
    )


def test_predict_gets_the_scripted_answer_with_usage() -> None:
    script = by_marker(
        {"Capital of France": fields(answer="Paris"), "Capital of Italy": fields(answer="Rome")}
    )
    with ScriptedLM(script, api_key="test-key") as fake:
        lm = client_lm(fake)
        qa = dspy.Predict("question -> answer")
        with dspy.context(lm=lm, adapter=ADAPTER):
            assert qa(question="Capital of Italy?").answer == "Rome"
            assert qa(question="Capital of France?").answer == "Paris"
            assert qa(question="Capital of France, again?").answer == "Paris"
        assert fake.calls == {"Capital of France": 2, "Capital of Italy": 1}
        usage = lm.history[-1]["usage"]
        assert usage["completion_tokens"] == len(fields(answer="Paris").split())
        assert usage["prompt_tokens"] == len(fake.requests[-1].prompt_text.split())
        assert fake.requests[-1].authorization == "Bearer test-key"


def test_an_rlm_step_parses_and_submits() -> None:
    """One RLM action step written by the fake, run by dspy's in-process interpreter."""
    step = fields(reasoning="count the words", code="SUBMIT(n=len(text.split()))")
    with ScriptedLM([step]) as fake:
        rlm = dspy.RLM("text -> n: int", max_iters=2, interpreter_factory=dspy.LocalInterpreter)
        with dspy.context(lm=client_lm(fake), adapter=ADAPTER):
            assert rlm(text="a b c d").n == 4
        assert sum(fake.calls.values()) == 1
        assert "Variable: `text`" in fake.requests[0].prompt_text


def test_a_list_script_is_used_in_order_and_then_says_it_is_used_up() -> None:
    with ScriptedLM(["one", Reply("two", key="second", prompt_tokens=7)]) as fake:
        lm = client_lm(fake)
        assert lm("first") == ["one"]
        assert lm("again") == ["two"]
        assert lm.history[-1]["usage"]["prompt_tokens"] == 7
        assert fake.calls == {"first": 1, "second": 1}
        answer = httpx.post(
            f"{fake.base_url}/chat/completions",
            json={"model": "x", "messages": [{"role": "user", "content": "third"}]},
        )
        assert answer.status_code == 500
        assert "scripted LM (a fake): the scripted replies are used up" in answer.text


def test_streaming_sends_openai_chunks_then_usage_then_done() -> None:
    with ScriptedLM([Reply("the answer is 42", completion_tokens=5)]) as fake:
        body = {
            "model": "x",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "go"}],
        }
        with httpx.stream("POST", f"{fake.base_url}/chat/completions", json=body) as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in answer.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == "the answer is 42"
        assert len([c for c in chunks if c["choices"]]) > 3  # really in pieces
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_a_gate_holds_the_reply_until_released() -> None:
    script = by_marker({"HOLD": Reply("held", gate="g"), "FREE": "free"})
    with ScriptedLM(script) as fake, concurrent.futures.ThreadPoolExecutor(2) as pool:
        gate = fake.gate("g")
        lm = client_lm(fake)
        held = pool.submit(lm, "HOLD this")
        assert gate.wait_reached(10)
        assert lm("FREE this") == ["free"]  # other calls are not held
        assert not held.done()  # still at the gate after a whole other call went through
        gate.release()
        assert held.result(10) == ["held"]
        assert gate.arrivals == 1
        assert fake.calls == {"HOLD": 1, "FREE": 1}


def test_a_wrong_key_is_refused_like_a_real_server() -> None:
    with ScriptedLM(["never"], api_key="right") as fake:
        with pytest.raises(Exception, match=r"(?i)api key|auth"):
            client_lm(fake, key="wrong")("hi")
        assert fake.refused_auth >= 1
        assert fake.calls == {}


def test_scripted_errors_reach_the_client() -> None:
    with ScriptedLM([Reply("overloaded, slow down", status=429)]) as fake:
        with pytest.raises(Exception, match="overloaded, slow down"):
            client_lm(fake)("hi")
        assert fake.calls == {"hi": 1}
