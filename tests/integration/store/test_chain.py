"""The hash chain: tampering is found at the altered event; schema evolution is not tampering."""

import base64
import json

import msgspec
from nats.js import JetStreamContext

from fleet_events import Event, new_id, streams
from fleet_events.codec import Codec
from fleet_events.session import TurnRequested, log_subject
from fleet_mesh.store import EMPTY, EventStore, verify_export

from .conftest import envelope


async def _log_of(store: EventStore, n: int) -> str:
    subject = log_subject("acme", new_id())
    head = EMPTY
    for i in range(n):
        head = (
            await store.append(subject, envelope(TurnRequested(message=f"m{i}")), expect=head)
        ).head
    return subject


async def test_changing_one_byte_of_a_stored_event_fails_verification_at_that_event(
    store: EventStore, js: JetStreamContext
) -> None:
    original = await _log_of(store, 6)
    assert (await store.verify(original)).ok
    # A stream never rewrites a message in place; an attacker with write access republishes.
    # Copy the log verbatim (same bytes, same chain headers) to another subject, one byte off.
    forged = log_subject("acme", new_id())
    forged_seqs: list[int] = []
    events = [e async for e in store.replay(original)]
    for index, event in enumerate(events):
        raw = await js.get_msg(streams.SESSIONS.name, event.seq, direct=True)
        assert raw.data is not None
        data = bytearray(raw.data)
        if index == 3:
            data[data.index(b"m3")] = ord("M")
        # the copy keeps the chain headers; its message ids are new (dedup would drop them)
        headers = {k: v for k, v in (raw.headers or {}).items() if k.startswith("Fleet-")}
        ack = await js.publish(forged, bytes(data), stream=streams.SESSIONS.name, headers=headers)
        forged_seqs.append(ack.seq)

    verdict = await store.verify(forged)
    assert not verdict.ok
    assert verdict.fault is not None
    assert verdict.fault.seq == forged_seqs[3]
    assert verdict.fault.subject == forged
    assert "altered payload" in verdict.fault.reason
    assert verdict.checked == 4  # three good events, then the bad one


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
        head = (await old.append(subject, envelope(NoteV1(text=f"n{i}")), expect=head)).head

    new = EventStore(js, streams.SESSIONS, Codec(events=[NoteV2]))
    assert (await new.verify(subject)).ok
    notes = [e.envelope.data async for e in new.replay(subject)]
    assert notes == [NoteV2(text=f"n{i}", priority=0) for i in range(3)]
    # ...and a new event appended with the new shape continues the same chain
    await new.append(subject, envelope(NoteV2(text="n3", priority=2)), expect=head)
    assert (await new.verify(subject)).checked == 4
    assert msgspec.json.decode(b'{"type":"test.note","text":"x"}', type=NoteV2).priority == 0
