"""The hash chain: tampering is found at the altered event; schema evolution is not tampering."""

import base64
import json

import msgspec
from nats.js import JetStreamContext

from fleet_events import Envelope, Event, new_id, streams
from fleet_events.chain import GENESIS, HASH_HEADER, PREV_HEADER, link
from fleet_events.codec import Codec
from fleet_events.session import TurnRequested, log_subject, run_subject, session_filter
from fleet_events.streams import StreamSpec
from fleet_mesh.store import EMPTY, EventStore, verify_export

from .conftest import envelope


async def _log_of(store: EventStore, n: int) -> str:
    subject = log_subject("acme", new_id())
    head = EMPTY
    for i in range(n):
        head = (
            await store.append(
                subject, envelope(TurnRequested(message=f"m{i}"), subject), expect=head
            )
        ).head
    return subject


async def test_changing_one_byte_of_a_stored_event_fails_verification_at_that_event(
    store: EventStore, js: JetStreamContext
) -> None:
    original = await _log_of(store, 6)
    assert (await store.verify(original)).ok
    # A stream never rewrites a message in place, so the test builds a stream holding what an
    # attacker with write access to the store would leave: the log's messages, verbatim (same
    # bytes, ids and chain headers), except one byte of the fourth.
    forged = StreamSpec(f"FORGED_{new_id()}", (f"forged-{new_id()}.>",))
    await js.add_stream(name=forged.name, subjects=list(forged.subjects), allow_direct=True)
    prefix = forged.subjects[0][:-1]
    copies: list[int] = []
    for index, event in enumerate([e async for e in store.replay(original)]):
        raw = await js.get_msg(streams.SESSIONS.name, event.seq, direct=True)
        assert raw.data is not None
        data = bytearray(raw.data)
        if index == 3:
            data[data.index(b"m3")] = ord("M")
        headers = {
            k: v for k, v in (raw.headers or {}).items() if k.startswith(("Fleet-", "Nats-Msg-Id"))
        }
        ack = await js.publish(prefix + original, bytes(data), stream=forged.name, headers=headers)
        copies.append(ack.seq)

    verdict = await EventStore(js, forged, Codec()).verify(prefix + ">")
    assert verdict.fault is not None
    assert verdict.fault.seq == copies[3]
    assert "altered payload" in verdict.fault.reason
    assert verdict.checked == 4  # three good events, then the bad one
    await js.delete_stream(forged.name)


async def test_changing_one_byte_of_an_exported_event_fails_verification_at_that_event(
    store: EventStore,
) -> None:
    subject = await _log_of(store, 5)
    lines = [line async for line in store.export(subject)]
    assert verify_export(lines).ok
    assert verify_export(lines).checked == 5

    row = json.loads(lines[2])
    payload = bytearray(base64.b64decode(row["payload"]))
    payload[-3] ^= 0x01
    row["payload"] = base64.b64encode(bytes(payload)).decode()
    tampered = [*lines[:2], json.dumps(row).encode(), *lines[3:]]

    verdict = verify_export(tampered)
    assert verdict.fault is not None
    assert verdict.fault.event_id == row["id"]
    assert verdict.fault.seq == row["seq"]
    dropped = [*lines[:2], *lines[3:]]  # removing an event breaks the next link
    assert verify_export(dropped).fault is not None
    assert "does not follow the chain head" in str(verify_export(dropped).fault)


class NoteV1(Event, frozen=True, kw_only=True, tag="test.note"):
    text: str


class NoteV2(Event, frozen=True, kw_only=True, tag="test.note"):
    text: str
    priority: int = 0


async def test_adding_a_defaulted_field_leaves_an_old_log_verifiable(js: JetStreamContext) -> None:
    old = EventStore(js, streams.SESSIONS, Codec(events=[NoteV1]))
    subject = log_subject("acme", new_id())
    head = EMPTY
    for i in range(3):
        head = (
            await old.append(subject, envelope(NoteV1(text=f"n{i}"), subject), expect=head)
        ).head

    new = EventStore(js, streams.SESSIONS, Codec(events=[NoteV2]))
    assert (await new.verify(subject)).ok
    notes = [e.envelope.data async for e in new.replay(subject)]
    assert notes == [NoteV2(text=f"n{i}", priority=0) for i in range(3)]
    # ...and a new event appended with the new shape continues the same chain
    await new.append(subject, envelope(NoteV2(text="n3", priority=2), subject), expect=head)
    assert (await new.verify(subject)).checked == 4
    assert msgspec.json.decode(b'{"type":"test.note","text":"x"}', type=NoteV2).priority == 0


async def test_an_export_edited_beyond_its_payloads_is_caught(store: EventStore) -> None:
    session = new_id()
    log, run = log_subject("acme", session), run_subject("acme", session, "r1")
    head_log = head_run = EMPTY
    for i in range(3):
        ev = envelope(TurnRequested(message=f"l{i}"), log)
        head_log = (await store.append(log, ev, expect=head_log)).head
        ev = envelope(TurnRequested(message=f"r{i}"), run)
        head_run = (await store.append(run, ev, expect=head_run)).head
    lines = [json.loads(line) async for line in store.export(session_filter("acme", session))]
    assert verify_export(json.dumps(r).encode() for r in lines).ok

    def check(rows: list[dict[str, object]]) -> str:
        fault = verify_export(json.dumps(r).encode() for r in rows).fault
        assert fault is not None
        return fault.reason

    renamed = [dict(r) for r in lines]
    renamed[1]["id"] = new_id()
    assert "stored under id" in check(renamed)
    moved = [dict(r) for r in lines]  # a run's events relabelled as another run's
    for r in moved:
        if r["subject"] == run:
            r["subject"] = run_subject("acme", session, "r2")
    assert "names run 'r1'" in check(moved)
    other_tenant = [dict(r) for r in lines]
    for r in other_tenant:
        r["subject"] = str(r["subject"]).replace(".acme.", ".evil.")
    assert "names tenant 'acme'" in check(other_tenant)
    reordered = [lines[1], lines[0], *lines[2:]]
    assert "out of stream order" in check(reordered)
    assert "unreadable" in verify_export([b'{"subject": "x"}']).fault.reason  # type: ignore[union-attr]


def _forged_row(subject: str, event: Envelope[Event]) -> bytes:
    """An export line for `event` on `subject`, chained correctly: only binding can object."""
    payload = msgspec.json.encode(event)
    return json.dumps(
        {
            "subject": subject,
            "seq": 1,
            "id": event.id,
            "prev": GENESIS,
            "hash": link(GENESIS, payload),
            "payload": base64.b64encode(payload).decode(),
        }
    ).encode()


def test_an_export_holding_an_event_without_a_session_on_a_session_log_is_caught() -> None:
    log = log_subject("acme", new_id())
    nameless = envelope(TurnRequested(message="injected"), "fleet.budget.none")
    fault = verify_export([_forged_row(log, nameless)]).fault
    assert fault is not None
    assert f"names no session but {log} belongs to session" in fault.reason


def test_an_export_holding_an_event_on_a_run_subject_with_extra_tokens_is_caught() -> None:
    session = new_id()
    other_run = envelope(TurnRequested(message="x"), run_subject("acme", session, "r2"))
    extra = run_subject("acme", session, "r1") + ".extra"
    fault = verify_export([_forged_row(extra, other_run)]).fault
    assert fault is not None
    assert "a session subject is fleet.session.<tenant>.<session>.log or" in fault.reason


async def test_verifying_the_store_flags_an_unbound_event_written_around_it(
    store: EventStore, js: JetStreamContext
) -> None:
    """What a writer with raw access to the stream could leave: correct chain headers, an event
    that names no session. The store's own verification must name it."""
    log = log_subject("acme", new_id())
    nameless = envelope(TurnRequested(message="injected"), "fleet.budget.none")
    payload = msgspec.json.encode(nameless)
    headers = {
        "Nats-Msg-Id": nameless.id,
        PREV_HEADER: GENESIS,
        HASH_HEADER: link(GENESIS, payload),
    }
    await js.publish(log, payload, stream=streams.SESSIONS.name, headers=headers)
    verdict = await store.verify(log)
    assert verdict.fault is not None
    assert verdict.fault.event_id == nameless.id
    assert "names no session" in verdict.fault.reason
