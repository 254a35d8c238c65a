"""Snapshot keys and validity, and exports, with no server."""

import base64
import json

import msgspec

from fleet_events.chain import GENESIS, HASH_HEADER, PREV_HEADER, ChainFault, link
from fleet_mesh.store import Head, Loaded, RawEvent, Verification
from fleet_mesh.store.records import (
    Snapshot,
    export_line,
    loaded_from,
    snapshot_key,
    snapshot_of,
    unusable,
    verify_export,
)


def test_a_wildcard_snapshot_key_never_equals_the_key_of_a_subject() -> None:
    assert snapshot_key("f", "fleet.session.a.s.>") == "f.fleet.session.a.s.=all"
    assert snapshot_key("f", "fleet.session.a.*.log") == "f.fleet.session.a.=any.log"
    assert snapshot_key("f", "fleet.session.a.s.log") == "f.fleet.session.a.s.log"
    assert snapshot_key("f", "fleet.session.a.s.run._all") != snapshot_key(
        "f", "fleet.session.a.s.run.>"
    )


def test_a_snapshot_keeps_the_fold_version_position_heads_and_state() -> None:
    loaded: Loaded[int] = Loaded(5, seq=9, heads={"a": Head(3, "h3"), "b": Head(9, "h9")})
    snap = snapshot_of("f", 2, loaded, b"\x05")
    assert snap == Snapshot(
        fold="f",
        version=2,
        seq=9,
        heads={"a": (3, "h3"), "b": (9, "h9")},
        state=msgspec.Raw(b"\x05"),
    )
    back = loaded_from(snap, 5)
    assert back == Loaded(
        5, seq=9, heads={"a": Head(3, "h3"), "b": Head(9, "h9")}, replayed=0, from_snapshot=True
    )


def test_a_snapshot_stands_for_the_log_only_with_the_same_fold_version_and_within_the_log() -> None:
    snap = snapshot_of("f", 2, Loaded(0, seq=9), b"")
    assert unusable(snap, "f", 2, last_seq=9) is None
    assert unusable(snap, "f", 2, last_seq=10) is None
    assert unusable(snap, "f", 2, last_seq=8) == "beyond the log"
    assert unusable(snap, "f", 3, last_seq=9) == "another fold version"
    assert unusable(snap, "g", 2, last_seq=9) == "another fold version"


def test_an_export_line_carries_the_verbatim_bytes_beside_the_chain_headers() -> None:
    raw = RawEvent("s", 4, {"Nats-Msg-Id": "e1", PREV_HEADER: "p", HASH_HEADER: "h"}, b"\x00stored")
    line = export_line(raw)
    assert b" " not in line  # compact: one event per line, nothing to normalise
    assert json.loads(line) == {
        "subject": "s",
        "seq": 4,
        "id": "e1",
        "prev": "p",
        "hash": "h",
        "payload": base64.b64encode(b"\x00stored").decode(),
    }
    assert json.loads(export_line(RawEvent("s", 5, {}, b"")))["id"] is None


def rows(*events: tuple[str, str, bytes]) -> list[bytes]:
    """Export lines of (subject, id, envelope bytes) events, chained as the store chains them."""
    heads: dict[str, str] = {}
    lines = []
    for seq, (subject, event_id, data) in enumerate(events, 1):
        prev = heads.get(subject, GENESIS)
        heads[subject] = link(prev, data)
        headers = {"Nats-Msg-Id": event_id, PREV_HEADER: prev, HASH_HEADER: heads[subject]}
        lines.append(export_line(RawEvent(subject, seq, headers, data)))
    return lines


LOG = "fleet.session.acme.s1.log"


def env(event_id: str) -> bytes:
    return msgspec.json.encode({"id": event_id, "tenant": "acme", "session": "s1"})


def test_an_export_verifies_on_its_own() -> None:
    verdict = verify_export(rows((LOG, "a", env("a")), (LOG, "b", env("b"))))
    assert verdict == Verification(2, None)


def test_verification_stops_at_the_first_fault_and_counts_what_it_checked() -> None:
    lines = rows((LOG, "a", env("a")), (LOG, "b", env("b")), (LOG, "c", env("c")))
    row = json.loads(lines[1])
    row["hash"] = None
    verdict = verify_export([lines[0], json.dumps(row).encode(), lines[2]])
    assert verdict == Verification(2, ChainFault(LOG, 2, "b", "no chain headers"))
    row = json.loads(lines[1])
    del row["prev"]
    assert verify_export([lines[0], json.dumps(row).encode()]).fault == ChainFault(
        LOG, 2, "b", "no chain headers"
    )


def _without(line: bytes, field: str, value: object = None) -> bytes:
    row = json.loads(line)
    if value is None:
        del row[field]
    else:
        row[field] = value
    return json.dumps(row).encode()


def test_an_unreadable_line_is_a_fault_naming_its_line_number() -> None:
    first, second = rows((LOG, "a", env("a")), (LOG, "b", env("b")))
    cases = {
        b"not json": "JSONDecodeError",
        _without(second, "payload"): "KeyError('payload')",
        _without(second, "subject"): "KeyError('subject')",
        _without(second, "seq"): "KeyError('seq')",
        _without(second, "id"): "KeyError('id')",
        _without(second, "seq", "two"): "ValueError",
        # a character outside base64 would be skipped by a lenient decoder: refused instead
        _without(second, "payload", "!" + json.loads(second)["payload"]): "Error('Only base64",
    }
    for bad, error in cases.items():
        verdict = verify_export([first, bad])
        assert verdict.checked == 1
        assert verdict.fault is not None
        assert (verdict.fault.subject, verdict.fault.seq, verdict.fault.event_id) == ("?", -1, "?")
        assert verdict.fault.reason.startswith("export line 2 is unreadable: ")
        assert error in verdict.fault.reason
    assert verify_export([b"{}"]).fault == ChainFault(
        "?", -1, "?", "export line 1 is unreadable: KeyError('payload')"
    )
