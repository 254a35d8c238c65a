"""The verifier's rules, with no server: what is signed, the key set, checkpoints."""

import json
import os
from pathlib import Path

import pytest

from fleet_events.chain import GENESIS, ChainVerifier, link
from fleet_events.signing import (
    CHECKPOINT,
    GENESIS_CHECKPOINT,
    SIGNING_KEY_ENV,
    Checkpoint,
    KeySet,
    Signer,
    SigningError,
    checkpoint_chain_problem,
    subject_matches,
)
from fleet_mesh.keyfiles import read_signer, signer_from_env, write_signer

LOG = "fleet.session.acme.s1.log"


def test_a_signature_covers_the_subject_and_the_hash() -> None:
    agent = Signer.generate("agent")
    keys = KeySet.of([agent])
    sig = agent.sign_append(LOG, "a" * 64)
    assert keys.append_problem(LOG, "a" * 64, agent.key_id, sig) is None
    assert keys.append_problem(LOG, "b" * 64, agent.key_id, sig) is not None
    moved = keys.append_problem("fleet.session.acme.s2.log", "a" * 64, agent.key_id, sig)
    assert moved == f"signature by agent (key {agent.key_id}) does not verify"
    assert keys.append_problem(LOG, "a" * 64, agent.key_id, "not base64!") is not None
    assert keys.append_problem(LOG, "a" * 64, None, sig) == (
        "half a signature (Fleet-Key or Fleet-Sig missing)"
    )


def test_unsigned_events_pass_only_where_signatures_are_not_required() -> None:
    agent = Signer.generate("agent")
    assert KeySet.of([agent]).append_problem(LOG, "a" * 64, None, None) == (
        "unsigned, and the pinned key set requires signatures"
    )
    lenient = KeySet.of([agent], require_signatures=False)
    assert lenient.append_problem(LOG, "a" * 64, None, None) is None
    bad = Signer.generate("agent").sign_append(LOG, "a" * 64)
    assert lenient.append_problem(LOG, "a" * 64, agent.key_id, bad) is not None


def test_a_checkpoint_key_cannot_sign_appends_nor_an_append_key_checkpoints() -> None:
    checkpointer = Signer.generate("checkpointer", CHECKPOINT)
    keys = KeySet.of([checkpointer])
    sig = checkpointer.sign_append(LOG, "a" * 64)
    assert "may not sign appends" in str(
        keys.append_problem(LOG, "a" * 64, checkpointer.key_id, sig)
    )
    with pytest.raises(SigningError, match="may not sign checkpoints"):
        Checkpoint(1, GENESIS_CHECKPOINT, "S", "t", 1, {}).signed(Signer.generate("agent"))


def test_the_key_set_round_trips_and_refuses_a_key_under_another_id() -> None:
    keys = KeySet.of([Signer.generate("agent"), Signer.generate("cp", CHECKPOINT)])
    assert KeySet.from_json(keys.to_json()).keys.keys() == keys.keys.keys()
    row = keys.to_json()
    row["keys"][0]["key_id"] = "0" * 16
    with pytest.raises(SigningError, match="does not match its key"):
        KeySet.from_json(row)
    with pytest.raises(SigningError, match="require_signatures must be true or false"):
        KeySet.from_json({**keys.to_json(), "require_signatures": "yes"})


def test_a_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    write_signer(Signer.generate("agent"), path)
    assert signer_from_env({SIGNING_KEY_ENV: str(path)}) is not None
    assert signer_from_env({}) is None
    os.chmod(path, 0o644)
    with pytest.raises(SigningError, match="chmod 600"):
        read_signer(path)
    cp = tmp_path / "cp.key"
    write_signer(Signer.generate("cp", CHECKPOINT), cp)
    with pytest.raises(SigningError, match="services sign with an append key"):
        signer_from_env({SIGNING_KEY_ENV: str(cp)})


def test_the_chain_verifier_checks_signatures_only_after_the_chain() -> None:
    agent = Signer.generate("agent")
    payload = json.dumps({"id": "e1", "tenant": "acme", "session": "s1"}).encode()
    digest = link(GENESIS, payload)
    verifier = ChainVerifier(keys=KeySet.of([agent]))
    assert verifier.feed(LOG, 1, "e1", GENESIS, digest, payload, agent.key_id, "x") is not None
    ok = ChainVerifier(keys=KeySet.of([agent]))
    sig = agent.sign_append(LOG, digest)
    assert ok.feed(LOG, 1, "e1", GENESIS, digest, payload, agent.key_id, sig) is None


def _chain(n: int, key: Signer) -> list[Checkpoint]:
    out, prev = [], GENESIS_CHECKPOINT
    for number in range(1, n + 1):
        cp = Checkpoint(number, prev, "S", "t", number, {LOG: (number, "a" * 64)}).signed(key)
        out.append(Checkpoint.parse(cp.line()))
        prev = cp.digest()
    return out


def test_checkpoints_chain_one_to_the_next() -> None:
    key = Signer.generate("cp", CHECKPOINT)
    keys = KeySet.of([key])
    chain = _chain(3, key)
    assert checkpoint_chain_problem(chain, keys) is None
    assert "checkpoint 1 was expected" in str(checkpoint_chain_problem(chain[1:], keys))
    swapped = [chain[0], chain[2], chain[1]]
    assert "checkpoint 2 was expected" in str(checkpoint_chain_problem(swapped, keys))
    assert "not in the pinned key set" in str(checkpoint_chain_problem(chain, KeySet.of([])))


def test_subject_filters_match_as_nats_does() -> None:
    assert subject_matches("fleet.session.acme.s1.>", "fleet.session.acme.s1.run.r1")
    assert not subject_matches("fleet.session.acme.s1.>", "fleet.session.acme.s1")
    assert subject_matches("fleet.*.acme.s1.log", LOG)
    assert not subject_matches("fleet.session.acme.s1", LOG)
