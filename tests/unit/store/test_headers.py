"""What an append puts in its headers, and what a stored message's headers say, with no server."""

import json

import pytest

from fleet_events.chain import GENESIS, HASH_HEADER, PREV_HEADER, TYPE_HEADER, link
from fleet_mesh.store import Appended, DuplicateElsewhere, Head, RawEvent, StoreError
from fleet_mesh.store.headers import (
    append_headers,
    batch_answer,
    batch_messages,
    committed,
    direct_more,
    direct_raw,
    duplicate_at,
    head_of,
)

HEAD = Head(41, link(GENESIS, b"before"))


def test_one_append_is_deduplicated_by_id_and_stored_only_right_after_the_expected_head() -> None:
    assert append_headers("e1", HEAD, b"bytes", "turn.requested") == {
        "Nats-Msg-Id": "e1",
        "Nats-Expected-Last-Subject-Sequence": "41",
        PREV_HEADER: HEAD.hash,
        HASH_HEADER: link(HEAD.hash, b"bytes"),
        TYPE_HEADER: "turn.requested",
    }


def test_a_batch_chains_each_event_from_the_one_before_and_commits_on_the_last() -> None:
    events = [("e1", b"one", "a.x"), ("e2", b"two", "b.y"), ("e3", b"three", "c.z")]
    messages = batch_messages(HEAD, events)
    h1 = link(HEAD.hash, b"one")
    h2 = link(h1, b"two")
    h3 = link(h2, b"three")
    assert messages == [
        (
            b"one",
            {
                "Nats-Batch-Id": "e1",
                "Nats-Batch-Sequence": "1",
                "Nats-Msg-Id": "e1",
                PREV_HEADER: HEAD.hash,
                HASH_HEADER: h1,
                TYPE_HEADER: "a.x",
                "Nats-Expected-Last-Subject-Sequence": "41",
            },
        ),
        (
            b"two",
            {
                "Nats-Batch-Id": "e1",
                "Nats-Batch-Sequence": "2",
                "Nats-Msg-Id": "e2",
                PREV_HEADER: h1,
                HASH_HEADER: h2,
                TYPE_HEADER: "b.y",
            },
        ),
        (
            b"three",
            {
                "Nats-Batch-Id": "e1",
                "Nats-Batch-Sequence": "3",
                "Nats-Msg-Id": "e3",
                PREV_HEADER: h2,
                HASH_HEADER: h3,
                TYPE_HEADER: "c.z",
                "Nats-Batch-Commit": "1",
            },
        ),
    ]
    assert committed(50, messages) == [Appended(48, h1), Appended(49, h2), Appended(50, h3)]


def test_a_batch_commit_answer_is_its_last_sequence_or_the_servers_refusal() -> None:
    assert batch_answer(b'{"stream":"S","seq":12}') == (12, None, "")
    refused = {"error": {"err_code": 10071, "description": "wrong last sequence: 7"}}
    assert batch_answer(json.dumps(refused).encode()) == (None, 10071, "wrong last sequence: 7")
    assert batch_answer(b'{"error":{"err_code":10201}}') == (None, 10201, "")


def test_a_head_needs_the_chain_hash_header() -> None:
    assert head_of("s", 9, {HASH_HEADER: "ab"}) == Head(9, "ab")
    with pytest.raises(StoreError) as caught:
        head_of("fleet.x", 9, {})
    assert str(caught.value) == (
        "the last message on fleet.x (seq 9) has no Fleet-Hash header: it was not written "
        "through the event store, so nothing can chain after it"
    )


def test_a_deduplicated_append_is_ours_only_on_the_same_subject() -> None:
    assert duplicate_at("s", "e1", "S", 7, "s", {HASH_HEADER: "ab"}) == Appended(
        7, "ab", duplicate=True
    )
    assert duplicate_at("s", "e1", "S", 7, "s", {}) == Appended(7, "", duplicate=True)
    with pytest.raises(DuplicateElsewhere) as caught:
        duplicate_at("s", "e1", "SESSIONS", 7, "t", {})
    assert str(caught.value) == (
        "event id e1 is already stored at sequence 7 on t, not on s: event ids must be unique "
        "across the SESSIONS stream"
    )


def test_a_direct_get_message_names_its_subject_and_sequence_in_headers() -> None:
    headers = {"Nats-Subject": "s", "Nats-Sequence": "12", HASH_HEADER: "ab"}
    assert direct_raw(headers, b"data") == RawEvent("s", 12, headers, b"data")


@pytest.mark.parametrize(
    ("end", "more"),
    [
        ({"Status": "204", "Nats-Num-Pending": "3"}, True),
        ({"Status": "204", "Nats-Num-Pending": "1"}, True),
        ({"Status": "204", "Nats-Num-Pending": "0"}, False),
        ({"Status": "204"}, False),
        ({"Status": "404"}, False),
        ({"Status": "404", "Nats-Num-Pending": "3"}, False),
    ],
)
def test_the_end_of_a_direct_batch_says_whether_more_match(end: dict[str, str], more: bool) -> None:
    assert direct_more("s from 1", end) is more


def test_any_other_end_status_is_an_error_naming_the_read() -> None:
    with pytest.raises(StoreError) as caught:
        direct_more("s from 4", {"Status": "408", "Description": "Request Timeout"})
    assert str(caught.value) == "reading s from 4: server answered 408 Request Timeout"
    with pytest.raises(StoreError) as bare:
        direct_more("s from 4", {})
    assert str(bare.value) == "reading s from 4: server answered None"
