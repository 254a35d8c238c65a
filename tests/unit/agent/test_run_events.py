"""The agent's step vocabulary on the wire: stable tags, old logs still read, new fields
optional, large prompts by reference, and one digest per request for replay."""

from typing import Any

import msgspec
import pytest

from fleet_events import Actor, BlobRef, Envelope, Event, utc_now
from fleet_events import run as r
from fleet_events import session as s
from fleet_events.catalog import BY_TAG
from fleet_events.codec import Codec

ACTOR = Actor(service="agent", replica="a-0")
BLOB = BlobRef(object="acme/" + "a" * 64, sha256="a" * 64, size=300_000)

# The tags logs were written with before this vocabulary grew: they never change.
ORIGINAL_TAGS = {
    "run.started": r.RunStarted,
    "run.cell_executed": r.CellExecuted,
    "run.llm_called": r.LlmCalled,
    "run.child_requested": r.ChildRunRequested,
    "run.child_completed": r.ChildRunCompleted,
    "run.completed": r.RunCompleted,
    "run.failed": r.RunFailed,
}

# One instance of every event this issue added or grew, with its new fields set.
SAMPLES: list[Event] = [
    r.RunStarted(
        kind="rlm",
        tree="tr",
        depth=1,
        task="t",
        mode="auto",
        signature="task -> answer",
        inputs={"task": "t", "n": 3},
        max_iters=20,
        max_llm_calls=50,
        sandbox="sb",
        parent_call="c1",
    ),
    r.IterationPlanned(index=2, reasoning="look", code="print(1)", llm_call="l2"),
    r.CellExecuted(
        code="SUBMIT(answer=1)",
        stdout="",
        cell_id="c2",
        iteration=2,
        final={"answer": 1},
        sandbox="sb",
        context="ctx",
        stdout_blob=BLOB,
    ),
    r.LlmCalled(
        role="planner",
        model="openai/m",
        prompt_tokens=5,
        completion_tokens=2,
        cost=0.01,
        latency_ms=3.5,
        call_id="l2",
        index=2,
        request_kind="step",
        grant_id="g2",
        messages=[
            r.ChatMessage(role="system", content="be brief"),
            r.ChatMessage(role="user", content="hi"),
        ],
        params={"temperature": 0},
        response="hello",
        request_hash="f" * 64,
        cell="c1",
    ),
    r.LlmCalled(role="sub", model="m", messages=BLOB, response=BLOB, cached=True, recorded=True),
    r.ToolCalled(call_id="k1", tool="load_document", args={"path": "a.txt"}, source="react"),
    r.ToolReturned(call_id="k1", tool="load_document", result={"chars": 10}, duration_ms=1.0),
    r.ToolReturned(call_id="k2", tool="sub_rlm", error="budget spent: 0 calls left"),
    r.Escalated(from_module="cot", to_module="react", rule="tools_needed", detail="[TOOLS NEEDED]"),
    r.FellBack(from_module="rlm", to_module="react", reason="rlm_failed", error="timeout"),
    r.ChildRunRequested(child_run="ch1", task="sum", call_id="k3", batch_index=1, depth=2),
    r.ChildRunCompleted(child_run="ch1", answer="4", child_head_hash="h" * 64, call_id="k3"),
    r.ChildRunFailed(child_run="ch2", error="cancelled", cancelled=True, call_id="k3"),
    r.RunCompleted(answer="4", outputs={"answer": "4", "notes": []}, iterations=3, llm_calls=5),
    r.RunFailed(error="boom", reason="sandbox_lost", retryable=True),
    r.RunCancelled(reason="user", partial_answer="so far"),
    s.CoreMemoryChanged(block="human", op="append", value="a", text="a"),
    s.CoreMemoryRefused(
        block="human", op="append", reason="over_limit", message="m", limit=2000, length=2001
    ),
    s.MemoryFileWritten(file=s.MemoryFile(path="memory/notes.md", sha256="b" * 64, size=3)),
    s.DocumentLoaded(
        document=s.DocumentRef(
            alias="d", source="url", origin="https://example.invalid/d", blob=BLOB
        )
    ),
    s.DocumentActivated(alias="d"),
    s.DocumentRemoved(alias="d", reason="user"),
    s.SandboxAttached(
        interpreter=s.InterpreterState(sandbox="sb", workspace="/w", context_paths=("src",)),
        replaces="sb0",
    ),
    s.SandboxDetached(sandbox="sb", reason="deleted"),
    s.InputRequested(request_id="q", question="which?", options=("a", "b"), timeout_s=60),
    s.InputProvided(request_id="q", answer="a", option="a"),
    s.InputExpired(request_id="q"),
    s.InputRefused(request_id="q", reason="none_pending", message="m"),
    s.SessionImported(
        image=s.SessionImage(turns=(s.HistoryTurn(question="q", answer="a"),)),
        source_session="old",
        source_head_hash="c" * 64,
    ),
    s.SessionRestored(image=s.SessionImage(), upto_seq=7, reason="time travel"),
]


def envelope(data: Event) -> Envelope[Event]:
    return Envelope(
        id="e1", tenant="acme", session="s1", run="r1", actor=ACTOR, ts=utc_now(), data=data
    )


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_every_step_round_trips_through_the_codec_exactly(event: Event) -> None:
    codec = Codec()
    decoded = codec.decode_stored(codec.encode_inline(envelope(event)))
    assert decoded.data == event
    assert type(decoded.data) is type(event)


def test_the_original_tags_still_name_the_same_events() -> None:
    for tag, cls in ORIGINAL_TAGS.items():
        assert BY_TAG[tag] is cls


@pytest.mark.parametrize(
    "old",
    [
        {"type": "run.started", "kind": "rlm", "tree": "t", "depth": 0, "task": ""},
        {
            "type": "run.cell_executed",
            "code": "1",
            "stdout": "1\n",
            "error": "",
            "duration_ms": 2.0,
        },
        {"type": "run.llm_called", "role": "planner", "model": "m", "prompt_tokens": 1},
        {"type": "run.child_requested", "child_run": "c", "task": "t"},
        {"type": "run.child_completed", "child_run": "c", "answer": "a", "child_head_hash": "h"},
        {"type": "run.completed", "answer": "a"},
        {"type": "run.failed", "error": "e"},
    ],
    ids=lambda d: d["type"],
)
def test_events_written_before_the_new_fields_still_decode(old: dict[str, Any]) -> None:
    raw = msgspec.json.encode(
        {"id": "e", "tenant": "acme", "actor": {"service": "agent", "replica": "a"},
         "ts": "2026-01-01T00:00:00Z", "data": old}
    )  # fmt: skip
    event = Codec().decode_stored(raw).data
    cls = BY_TAG[old["type"]]
    assert type(event) is cls
    assert event == cls(**{k: v for k, v in old.items() if k != "type"})


def test_a_field_from_a_newer_replica_is_ignored_not_fatal() -> None:
    raw = msgspec.json.encode(
        {"id": "e", "tenant": "acme", "actor": {"service": "agent", "replica": "a"},
         "ts": "2026-01-01T00:00:00Z",
         "data": {"type": "run.llm_called", "role": "r", "model": "m", "thinking_tokens": 9}}
    )  # fmt: skip
    assert Codec().decode_stored(raw).data == r.LlmCalled(role="r", model="m")


def test_a_choice_added_later_still_decodes() -> None:
    """Choices are strings, not Literals: an older replica reads a rule it has never heard of."""
    raw = msgspec.json.encode(
        {"id": "e", "tenant": "acme", "actor": {"service": "agent", "replica": "a"},
         "ts": "2026-01-01T00:00:00Z",
         "data": {"type": "run.escalated", "from_module": "cot", "to_module": "planner2",
                  "rule": "rule_from_the_future"}}
    )  # fmt: skip
    event = Codec().decode_stored(raw).data
    assert isinstance(event, r.Escalated)
    assert event.rule == "rule_from_the_future"


def test_messages_and_response_are_inline_or_by_reference() -> None:
    codec = Codec()
    inline, by_ref = SAMPLES[3], SAMPLES[4]
    assert isinstance(inline, r.LlmCalled)
    assert isinstance(by_ref, r.LlmCalled)
    got = codec.decode_stored(codec.encode_inline(envelope(inline))).data
    assert isinstance(got.messages, list)
    assert isinstance(got.messages[0], r.ChatMessage)
    assert got.response == "hello"
    got = codec.decode_stored(codec.encode_inline(envelope(by_ref))).data
    assert got.messages == BLOB
    assert got.response == BLOB


def test_the_request_digest_ignores_key_order_and_nothing_else() -> None:
    messages = [r.ChatMessage(role="user", content="hi")]
    digest = r.request_digest("m", messages, {"temperature": 0, "max_tokens": 5})
    assert digest == r.request_digest("m", messages, {"max_tokens": 5, "temperature": 0})
    assert len(digest) == 64
    others = {
        r.request_digest("m2", messages, {"temperature": 0, "max_tokens": 5}),
        r.request_digest(
            "m", [r.ChatMessage(role="user", content="hi!")], {"temperature": 0, "max_tokens": 5}
        ),
        r.request_digest(
            "m", [r.ChatMessage(role="system", content="hi")], {"temperature": 0, "max_tokens": 5}
        ),
        r.request_digest("m", messages, {"temperature": 1, "max_tokens": 5}),
        r.request_digest("m", messages, {"temperature": 0}),
    }
    assert digest not in others
    assert len(others) == 5


def test_the_digest_is_fixed_across_processes_and_versions() -> None:
    """Pinned: a recorded run's digests must still match after an upgrade."""
    got = r.request_digest("m", [r.ChatMessage(role="user", content="hi")], {"t": 0})
    assert got == "657bb1886a1b18685b77aead191caa387557bd9d443b10e5a163ab94a66bab55"


def test_every_run_ending_is_terminal() -> None:
    assert set(r.TERMINAL) == {r.RunCompleted, r.RunFailed, r.RunCancelled}
    assert all(cls in r.EVENTS for cls in r.TERMINAL)


def test_named_choices_are_the_documented_ones() -> None:
    assert r.MODULES == ("cot", "code", "react", "rlm")
    assert set(r.ESCALATION_RULES) == {
        "tools_needed",
        "context_over_threshold",
        "rlm_only",
        "forced",
        "computable",
    }
    assert r.REQUEST_KINDS == ("step", "sub")
    assert s.CORE_MEMORY_LIMITS == {"persona": 2000, "human": 2000, "scratchpad": 1000}
