"""Forgeries on the Daytona host-callback channel, replayed against the gate itself.

Each test is an attack a cell can make: it writes whatever frames it likes under whatever
token directory it likes, in its own sandbox. Identity must come from where the broker read
the frame and from the token's issue record, never from the frame.
"""

import json

import pytest

from fleet_sandbox_broker.providers.daytona.callbacks import CallbackGate, CallbackRefused


def frame(seq: int, name: str = "llm_query", **extra: object) -> bytes:
    return json.dumps({"seq": seq, "name": name, "args": ["q"], **extra}).encode()


def test_a_frame_is_relayed_as_the_issuing_execution() -> None:
    gate = CallbackGate()
    token = gate.issue("sb-a", "main", "exec-1")
    call = gate.admit("sb-a", token, frame(1))
    assert (call.sandbox, call.context, call.request_id, call.name) == (
        "sb-a",
        "main",
        "exec-1:1",
        "llm_query",
    )


def test_a_finished_executions_token_is_refused() -> None:
    gate = CallbackGate()
    old = gate.issue("sb-a", "main", "exec-1")
    gate.revoke(old)  # the execution ended; a cell left running keeps writing frames
    gate.issue("sb-a", "main", "exec-2")
    with pytest.raises(CallbackRefused, match="no execution of sandbox sb-a is running"):
        gate.admit("sb-a", old, frame(1))


def test_another_sandboxs_token_read_from_this_sandbox_is_refused() -> None:
    gate = CallbackGate()
    victim = gate.issue("sb-victim", "main", "exec-v")
    gate.issue("sb-attacker", "main", "exec-a")
    # the attacker learnt the victim's token and wrote a frame under it in its own sandbox
    with pytest.raises(CallbackRefused, match="no execution of sandbox sb-attacker"):
        gate.admit("sb-attacker", victim, frame(1))
    # and the victim's channel is untouched: its own first frame still goes through
    assert gate.admit("sb-victim", victim, frame(1)).sandbox == "sb-victim"


def test_a_frame_that_names_an_identity_is_malformed() -> None:
    gate = CallbackGate()
    token = gate.issue("sb-a", "main", "exec-1")
    for forged in ({"sandbox": "sb-b"}, {"context": "other"}, {"execution": "exec-9"}):
        with pytest.raises(CallbackRefused, match="malformed frame"):
            gate.admit("sb-a", token, frame(1, **forged))


def test_a_replayed_frame_is_refused_and_never_run_twice() -> None:
    gate = CallbackGate()
    token = gate.issue("sb-a", "main", "exec-1")
    gate.admit("sb-a", token, frame(1))
    gate.finished("sb-a")
    with pytest.raises(CallbackRefused, match="replayed"):
        gate.admit("sb-a", token, frame(1))
    with pytest.raises(CallbackRefused, match="replayed"):
        gate.admit("sb-a", token, frame(1, name="sub_rlm"))
    assert gate.admit("sb-a", token, frame(2)).request_id == "exec-1:2"


def test_a_flood_is_bounded_refused_at_once_and_then_stopped() -> None:
    gate = CallbackGate(max_in_flight=8, max_refusals=64)
    token = gate.issue("sb-a", "main", "exec-1")
    admitted, refused, fatal = 0, 0, None
    for seq in range(1, 301):
        try:
            gate.admit("sb-a", token, frame(seq))
            admitted += 1
        except CallbackRefused as exc:
            refused += 1
            if exc.fatal:
                fatal = seq
                break
    assert admitted == 8
    assert fatal == 8 + 64  # the 64th refusal stops the execution
    assert refused == 64


def test_an_oversized_or_garbage_frame_is_refused() -> None:
    gate = CallbackGate(max_frame_bytes=1024)
    token = gate.issue("sb-a", "main", "exec-1")
    with pytest.raises(CallbackRefused, match="over the 1024 byte limit"):
        gate.admit("sb-a", token, frame(1, kwargs={"x": "y" * 2000}))
    with pytest.raises(CallbackRefused, match="not a JSON frame"):
        gate.admit("sb-a", token, b"\x00\xff")
