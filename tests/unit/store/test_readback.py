"""The lost-ack read-back: the events after `expect` are ours only if every id matches, in order."""

import pytest

from fleet_events.chain import HASH_HEADER
from fleet_mesh.store import AppendConflict, Appended, DuplicateInBatch, RawEvent
from fleet_mesh.store.readback import BATCH_DUPLICATE_ID, WRONG_LAST_SEQUENCE, ours, refusal


def stored(*ids: str, first_seq: int = 7) -> list[RawEvent]:
    return [
        RawEvent("s", first_seq + i, {"Nats-Msg-Id": id_, HASH_HEADER: f"h{i}"}, b"")
        for i, id_ in enumerate(ids)
    ]


def test_our_events_right_after_the_expected_head_are_a_duplicate_with_their_stored_heads() -> None:
    assert ours(["a", "b"], stored("a", "b")) == [
        Appended(7, "h0", duplicate=True),
        Appended(8, "h1", duplicate=True),
    ]


@pytest.mark.parametrize(
    "found",
    [
        ("b", "a"),  # ours, but not in our order
        ("a",),  # only part of the batch
        ("x", "a", "b"),  # another writer got there first
        ("a", "x"),  # a retried request stored our first id alone, then someone else wrote
        (),
    ],
)
def test_anything_but_exactly_our_ids_in_order_is_not_ours(found: tuple[str, ...]) -> None:
    assert ours(["a", "b"], stored(*found)) is None


def test_a_stored_event_without_a_hash_header_reads_back_with_an_empty_hash() -> None:
    raw = RawEvent("s", 3, {"Nats-Msg-Id": "a"}, b"")
    assert ours(["a"], [raw]) == [Appended(3, "", duplicate=True)]


def test_a_refusal_on_a_moved_subject_is_a_conflict_carrying_the_actual_head() -> None:
    conflict = refusal("s", 4, 9, WRONG_LAST_SEQUENCE, "wrong last sequence: 9")
    assert type(conflict) is AppendConflict
    assert (conflict.subject, conflict.expected, conflict.actual) == ("s", 4, 9)
    assert str(conflict) == "append to s expected last sequence 4: wrong last sequence: 9"


def test_a_reused_id_in_a_batch_on_an_unmoved_subject_is_said_so() -> None:
    reused = refusal("s", 4, 4, BATCH_DUPLICATE_ID, "dup")
    assert type(reused) is DuplicateInBatch
    assert (reused.subject, reused.expected, reused.actual) == ("s", 4, 4)
    assert str(reused) == "append to s expected last sequence 4: dup"
    assert type(refusal("s", 4, 5, BATCH_DUPLICATE_ID, "dup")) is AppendConflict
    assert type(refusal("s", 4, 4, WRONG_LAST_SEQUENCE, "x")) is AppendConflict


def test_a_refusal_without_a_description_says_what_it_was() -> None:
    assert str(refusal("s", 1, 2, None, None)).endswith(": wrong last sequence")
    assert str(refusal("s", 1, 2, None, "")).endswith(": wrong last sequence")
