"""Signed headers and signed exports, with no server: what the store adds, what the verifier
reads back, and the key-set line it shows but never trusts."""

import json

import msgspec

from fleet_events.chain import GENESIS, HASH_HEADER, link
from fleet_events.signing import CHECKPOINT, KEY_HEADER, SIG_HEADER, Checkpoint, KeySet, Signer
from fleet_mesh.store import Head, RawEvent
from fleet_mesh.store.headers import append_headers, batch_messages, signed
from fleet_mesh.store.records import export_line, exported_keys, keyset_line, verify_export

LOG = "fleet.session.acme.s1.log"
AGENT = Signer.generate("agent")
KEYS = KeySet.of([AGENT])


def env(event_id: str) -> bytes:
    return msgspec.json.encode({"id": event_id, "tenant": "acme", "session": "s1"})


def lines_of(*ids: str, signer: Signer | None = AGENT) -> list[bytes]:
    head, lines = Head(0, GENESIS), []
    for seq, event_id in enumerate(ids, 1):
        headers = signed(LOG, append_headers(event_id, head, env(event_id), "t"), signer)
        lines.append(export_line(RawEvent(LOG, seq, headers, env(event_id))))
        head = Head(seq, headers[HASH_HEADER])
    return lines


def test_the_store_signs_the_subject_and_hash_it_appends_and_nothing_without_a_key() -> None:
    headers = signed(LOG, append_headers("e1", Head(0, GENESIS), env("e1"), "t"), AGENT)
    assert headers[KEY_HEADER] == AGENT.key_id
    assert headers[SIG_HEADER] == AGENT.sign_append(LOG, link(GENESIS, env("e1")))
    unsigned = signed(LOG, append_headers("e1", Head(0, GENESIS), env("e1"), "t"), None)
    assert KEY_HEADER not in unsigned
    assert SIG_HEADER not in unsigned
    batch = batch_messages(Head(0, GENESIS), [("a", env("a"), "t"), ("b", env("b"), "t")])
    for _, h in batch:
        signed(LOG, h, AGENT)
    second = batch[1][1]
    assert KEYS.append_problem(LOG, second[HASH_HEADER], AGENT.key_id, second[SIG_HEADER]) is None


def test_an_unsigned_line_keeps_its_shape_and_a_signed_one_carries_key_and_sig() -> None:
    (plain,) = lines_of("a", signer=None)
    assert set(json.loads(plain)) == {"subject", "seq", "id", "prev", "hash", "payload"}
    (line,) = lines_of("a")
    assert json.loads(line)["key"] == AGENT.key_id


def test_the_key_set_line_is_shown_and_skipped_and_the_pinned_keys_decide() -> None:
    lines = [keyset_line(KEYS), *lines_of("a", "b")]
    shown = exported_keys(lines)
    assert shown is not None
    assert set(shown.keys) == {AGENT.key_id}
    verdict = verify_export(lines, keys=KEYS)
    assert verdict.ok
    assert verdict.checked == 2
    other = KeySet.of([Signer.generate("agent")])
    fault = verify_export(lines, keys=other).fault
    assert fault is not None
    assert fault.event_id == "a"
    assert exported_keys(lines_of("a")) is None


def test_unsigned_lines_verify_only_where_signatures_are_not_required() -> None:
    lines = lines_of("a", signer=None)
    assert verify_export(lines).ok
    assert verify_export(lines, keys=KeySet.of([AGENT], require_signatures=False)).ok
    fault = verify_export(lines, keys=KEYS).fault
    assert fault is not None
    assert fault.reason == "unsigned, and the pinned key set requires signatures"


def test_checkpoints_need_pinned_keys_and_a_pinned_hash_must_match() -> None:
    checkpointer = Signer.generate("cp", CHECKPOINT)
    keys = KeySet.of([AGENT, checkpointer])
    lines = lines_of("a", "b")
    wrong = Checkpoint(1, "0" * 64, "S", "t", 2, {LOG: (2, "f" * 64)}).signed(checkpointer)
    no_keys = verify_export(lines, checkpoints=[wrong]).fault
    assert no_keys is not None
    assert "without pinned keys" in no_keys.reason
    fault = verify_export(lines, keys=keys, checkpoints=[wrong]).fault
    assert fault is not None
    assert (fault.event_id, fault.seq) == ("b", 2)
    assert "rewritten after the checkpoint" in fault.reason
    right_hash = json.loads(lines[1])["hash"]
    right = Checkpoint(1, "0" * 64, "S", "t", 2, {LOG: (2, right_hash)}).signed(checkpointer)
    assert verify_export(lines, keys=keys, checkpoints=[right]).ok
    cut = verify_export(lines[:1], keys=keys, checkpoints=[right], within="fleet.session.acme.s1.>")
    assert cut.fault is not None
    assert (cut.fault.subject, cut.fault.seq) == (LOG, 2)
