"""The hash chain, with no server: the link rule, and the verifier's verdict on every fault."""

import hashlib

import msgspec

from fleet_events.chain import GENESIS, ChainFault, ChainVerifier, link

LOG = "fleet.session.acme.s1.log"
OTHER = "fleet.session.acme.s2.log"


def payload(event_id: str, session: str = "s1", tenant: str = "acme") -> bytes:
    return msgspec.json.encode({"id": event_id, "tenant": tenant, "session": session})


def chained(prev: str, event_id: str, session: str = "s1") -> tuple[str, bytes, str]:
    data = payload(event_id, session)
    return prev, data, link(prev, data)


def test_a_link_is_sha256_of_the_previous_hash_bytes_then_the_payload() -> None:
    expected = hashlib.sha256(bytes.fromhex(GENESIS) + b"stored bytes").hexdigest()
    assert link(GENESIS, b"stored bytes") == expected
    assert link(GENESIS, memoryview(b"stored bytes")) == expected
    assert link(expected, b"x") == hashlib.sha256(bytes.fromhex(expected) + b"x").hexdigest()


def test_two_interleaved_chains_each_starting_at_genesis_verify() -> None:
    verifier = ChainVerifier()
    prev1, data1, hash1 = chained(GENESIS, "a")
    prev2, data2, hash2 = chained(GENESIS, "b", "s2")
    prev3, data3, hash3 = chained(hash1, "c")
    assert verifier.feed(LOG, 1, "a", prev1, hash1, data1) is None
    assert verifier.feed(OTHER, 2, "b", prev2, hash2, data2) is None
    assert verifier.feed(LOG, 5, "c", prev3, hash3, data3) is None
    assert (verifier.checked, verifier.last_seq, verifier.fault) == (3, 5, None)
    assert verifier.heads == {LOG: hash3, OTHER: hash2}


def fault_of(
    *feeds: tuple[str, int, str, str | None, str | None, bytes], trust: bool = False
) -> str:
    verifier = ChainVerifier(trust_first=trust)
    for feed in feeds:
        if verifier.feed(*feed) is not None:
            break
    assert verifier.fault is not None
    return verifier.fault.reason


def test_a_chain_read_from_the_start_must_start_at_genesis() -> None:
    prev, data, digest = chained("1" * 64, "a")
    assert fault_of((LOG, 1, "a", prev, digest, data)) == (
        "prev hash 111111111111… does not follow the chain head 000000000000…"
    )
    trusting = ChainVerifier(trust_first=True)
    assert trusting.feed(LOG, 1, "a", prev, digest, data) is None
    _, data2, digest2 = chained(digest, "b")
    assert trusting.feed(LOG, 2, "b", prev, digest2, data2) is not None  # only the first is trusted


def test_missing_or_malformed_chain_headers_are_faults() -> None:
    _, data, digest = chained(GENESIS, "a")
    assert fault_of((LOG, 1, "a", None, digest, data)) == "no chain headers"
    assert fault_of((LOG, 1, "a", GENESIS, None, data)) == "no chain headers"
    malformed = "malformed chain headers (expected 64 lowercase hex digits)"
    assert fault_of((LOG, 1, "a", GENESIS.replace("0", "A"), digest, data)) == malformed
    assert fault_of((LOG, 1, "a", GENESIS, digest.upper(), data)) == malformed
    assert fault_of((LOG, 1, "a", GENESIS, digest[:-1], data)) == malformed


def test_sequences_must_strictly_increase() -> None:
    prev, data, digest = chained(GENESIS, "a")
    _, data2, digest2 = chained(digest, "b")
    assert fault_of((LOG, 5, "a", prev, digest, data), (LOG, 5, "b", digest, digest2, data2)) == (
        "out of stream order (sequence 5 after 5)"
    )


def test_altered_bytes_foreign_ids_and_unbound_events_are_faults() -> None:
    prev, data, digest = chained(GENESIS, "a")
    assert fault_of((LOG, 1, "a", prev, digest, data + b" ")) == (
        "stored bytes do not match the event's hash (altered payload)"
    )
    assert (
        fault_of((LOG, 1, "z", prev, digest, data)) == "stored under id z but the event inside is a"
    )
    junk = b"not json"
    assert fault_of((LOG, 1, "a", GENESIS, link(GENESIS, junk), junk)) == (
        "stored bytes are not an event envelope"
    )
    _, moved, moved_hash = chained(GENESIS, "a", session="s9")
    assert "names session 's9'" in fault_of((LOG, 1, "a", GENESIS, moved_hash, moved))


def test_the_first_fault_is_kept_and_nothing_after_it_is_checked() -> None:
    verifier = ChainVerifier()
    prev, data, digest = chained(GENESIS, "a")
    first = verifier.feed(LOG, 3, "a", prev, digest, data + b"!")
    assert first == ChainFault(
        LOG, 3, "a", "stored bytes do not match the event's hash (altered payload)"
    )
    assert str(first) == (
        f"event a (seq 3 on {LOG}): stored bytes do not match the event's hash (altered payload)"
    )
    _, good, good_hash = chained(GENESIS, "b", "s2")
    assert verifier.feed(OTHER, 4, "b", GENESIS, good_hash, good) is first
    assert (verifier.checked, verifier.last_seq, verifier.heads) == (1, 0, {})
