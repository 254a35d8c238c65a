"""The WebSocket's string caps (`live.event_frame`, `live.delta_frame`): what a `compact` or
`verbose` socket is sent of a stored event, and that a cut frame says so."""

import json

import msgspec

from fleet_gateway.live import STRING_CAP, TraceMode, delta_frame, event_frame

SUBJECT = "fleet.session.t1.s1.run.r1"


def _frame(payload: object, mode: TraceMode) -> dict[str, object]:
    text = event_frame(SUBJECT, 7, "ab" * 32, msgspec.json.encode(payload), STRING_CAP[mode])
    parsed: dict[str, object] = json.loads(text)  # every frame is whole JSON
    return parsed


def test_a_long_string_is_cut_to_the_modes_cap_and_the_frame_says_so() -> None:
    stdout = "x" * 3_000
    payload = {"id": "e1", "data": {"type": "run.cell_executed", "stdout": stdout, "n": 3}}
    compact = _frame(payload, "compact")
    assert compact["truncated"] is True
    event = compact["event"]
    assert isinstance(event, dict)
    assert event["data"]["stdout"] == "x" * 2_000
    assert (event["id"], event["data"]["n"], event["data"]["type"]) == (
        "e1",
        3,
        "run.cell_executed",
    )
    verbose = _frame(payload, "verbose")
    assert "truncated" not in verbose
    assert verbose["event"] == payload  # under verbose's 65,536 nothing is cut


def test_strings_inside_lists_and_objects_are_cut_and_other_values_kept() -> None:
    payload = {
        "messages": [
            {"role": "user", "content": "q" * 2_500},
            {"role": "assistant", "content": "a"},
        ],
        "outputs": {"answer": "y" * 2_001, "score": 0.5, "ok": True, "none": None},
    }
    event = _frame(payload, "compact")["event"]
    assert isinstance(event, dict)
    assert [len(m["content"]) for m in event["messages"]] == [2_000, 1]
    assert event["outputs"] == {"answer": "y" * 2_000, "score": 0.5, "ok": True, "none": None}


def test_a_frame_within_the_cap_carries_the_stored_bytes_unchanged() -> None:
    stored = b'{"id":"e2","data":{"type":"turn.requested","message":"hi \\u00e9"}}'
    text = event_frame(SUBJECT, 9, "cd" * 32, stored, STRING_CAP["compact"])
    assert stored.decode() in text  # byte for byte: the client can check the hash
    assert "truncated" not in json.loads(text)


def test_a_long_payload_of_short_strings_is_not_marked_truncated() -> None:
    payload = {"items": ["z" * 100] * 50}  # 5,000+ bytes, no string over 2,000
    frame = _frame(payload, "compact")
    assert "truncated" not in frame
    assert frame["event"] == payload


def test_a_delta_is_capped_and_what_is_no_delta_is_never_forwarded() -> None:
    data = msgspec.json.encode({"kind": "assistant_token", "run": "r1", "text": "t" * 5_000})
    frame = json.loads(delta_frame(data, STRING_CAP["compact"]) or "null")
    assert frame == {"type": "delta", "kind": "assistant_token", "run": "r1", "text": "t" * 2_000}
    assert delta_frame(b"not json", 2_000) is None
    assert delta_frame(msgspec.json.encode({"text": "no kind"}), 2_000) is None
