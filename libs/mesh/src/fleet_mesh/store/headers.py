"""The store's side of the wire, as pure functions: the headers an append carries (the chain
links of a batch among them) and what the headers of a stored message say.

Kept apart from the I/O so each rule can be checked, and mutation-tested, with no server.
"""

import json
from collections.abc import Mapping, Sequence

from fleet_events.chain import HASH_HEADER, PREV_HEADER, TYPE_HEADER, link
from fleet_events.signing import KEY_HEADER, SIG_HEADER, Signer
from fleet_mesh.store.errors import DuplicateElsewhere, StoreError
from fleet_mesh.store.model import Appended, Head, RawEvent

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"


def append_headers(event_id: str, expect: Head, payload: bytes, event_type: str) -> dict[str, str]:
    """One event's append: deduplicated by its id, stored only right after `expect`."""
    return {
        MSG_ID: event_id,
        EXPECTED_LAST: str(expect.seq),
        PREV_HEADER: expect.hash,
        HASH_HEADER: link(expect.hash, payload),
        TYPE_HEADER: event_type,
    }


def signed(subject: str, headers: dict[str, str], signer: Signer | None) -> dict[str, str]:
    """The headers with the appender's signature over the chain hash they carry."""
    if signer is not None:
        headers[KEY_HEADER] = signer.key_id
        headers[SIG_HEADER] = signer.sign_append(subject, headers[HASH_HEADER])
    return headers


def batch_messages(
    expect: Head, events: Sequence[tuple[str, bytes, str]]
) -> list[tuple[bytes, dict[str, str]]]:
    """An atomic batch of (event id, payload, type): each event chains from the one before it,
    only the first carries the sequence check (the server stores the batch contiguously), the
    last commits it, and the first event's id names the batch."""
    batch_id = events[0][0]
    prev = expect.hash
    messages: list[tuple[bytes, dict[str, str]]] = []
    for index, (event_id, payload, event_type) in enumerate(events, 1):
        digest = link(prev, payload)
        headers = {
            BATCH_ID: batch_id,
            BATCH_SEQUENCE: str(index),
            MSG_ID: event_id,
            PREV_HEADER: prev,
            HASH_HEADER: digest,
            TYPE_HEADER: event_type,
        }
        if index == 1:
            headers[EXPECTED_LAST] = str(expect.seq)
        if index == len(events):
            headers[BATCH_COMMIT] = "1"
        messages.append((payload, headers))
        prev = digest
    return messages


def committed(last_seq: int, messages: Sequence[tuple[bytes, Mapping[str, str]]]) -> list[Appended]:
    """A committed batch ends at `last_seq`; its events sit contiguously before it."""
    first = last_seq - len(messages) + 1
    return [Appended(first + i, headers[HASH_HEADER]) for i, (_, headers) in enumerate(messages)]


def batch_answer(data: bytes) -> tuple[int | None, int | None, str]:
    """A batch commit's JSON answer: (last sequence, error code, error description)."""
    answer = json.loads(data)
    error = answer.get("error")
    if error:
        return None, error.get("err_code"), str(error.get("description") or "")
    return int(answer["seq"]), None, ""


def head_of(subject: str, seq: int, headers: Mapping[str, str]) -> Head:
    """The head a subject's last message makes; one written around the store has none."""
    digest = headers.get(HASH_HEADER)
    if digest is None:
        raise StoreError(
            f"the last message on {subject} (seq {seq}) has no {HASH_HEADER} header: it "
            "was not written through the event store, so nothing can chain after it"
        )
    return Head(seq, digest)


def duplicate_at(
    subject: str, event_id: str, stream: str, seq: int, stored_on: str, headers: Mapping[str, str]
) -> Appended:
    """The server deduplicated an append against the message at `seq`: ours only if it sits on
    the same subject (ids are unique across the whole stream)."""
    if stored_on != subject:
        raise DuplicateElsewhere(
            f"event id {event_id} is already stored at sequence {seq} on {stored_on}, "
            f"not on {subject}: event ids must be unique across the {stream} stream"
        )
    return Appended(seq, headers.get(HASH_HEADER, ""), duplicate=True)


def direct_raw(headers: Mapping[str, str], data: bytes) -> RawEvent:
    """A message of a batched direct get: the server names its subject and sequence in headers."""
    return RawEvent(headers["Nats-Subject"], int(headers["Nats-Sequence"]), dict(headers), data)


def direct_more(where: str, end: Mapping[str, str]) -> bool:
    """Whether more messages match after a batched direct get's end-of-batch status."""
    status = end.get("Status")
    if status not in ("204", "404"):
        raise StoreError(
            f"reading {where}: server answered {status} {end.get('Description', '')}".rstrip()
        )
    return status == "204" and int(end.get("Nats-Num-Pending", "0")) > 0
