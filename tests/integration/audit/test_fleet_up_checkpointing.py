"""`fleet up`'s checkpointing role: it holds the checkpoint key, signs the heads the services'
signed appends make, and refuses to start over a checkpoint file it cannot vouch for."""

import json
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from fleet_cli.keys import CHECKPOINTS_DIR, checkpointing, ensure_keys, key_path
from fleet_events import new_id, streams
from fleet_events.session import TurnRequested, log_subject
from fleet_events.signing import Checkpoint, KeySet, Signer, SigningError
from fleet_harness.waits import eventually
from fleet_mesh.checkpoints import checkpoint_file, read_checkpoints
from fleet_mesh.keyfiles import read_keyset, read_signer
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EMPTY, open_store

from .conftest import envelope


async def test_fleet_up_checkpoints_what_its_services_sign(
    private_nats: NatsServer, private_js: JetStreamContext, tmp_path: Path
) -> None:
    keys = ensure_keys(tmp_path, ["agent"])
    agent = await open_store(
        private_js, streams.SESSIONS, signer=read_signer(key_path(tmp_path, "agent"))
    )
    subject = log_subject("acme", new_id())
    appended = await agent.append(
        subject, envelope(TurnRequested(message="hi"), subject), expect=EMPTY
    )
    path = checkpoint_file(tmp_path / CHECKPOINTS_DIR, streams.SESSIONS.name)
    async with checkpointing(private_nats.url, tmp_path, interval_s=3600):
        written = await eventually(lambda: read_checkpoints(path) or None, what="a checkpoint")
    (cp,) = written
    assert cp.heads == {subject: (appended.seq, appended.hash)}
    assert (await agent.verify(subject, keys=keys, checkpoints=written)).ok
    assert (path.stat().st_mode & 0o077) == 0


async def test_fleet_up_will_not_extend_a_checkpoint_file_it_cannot_vouch_for(
    private_nats: NatsServer, private_js: JetStreamContext, tmp_path: Path
) -> None:
    ensure_keys(tmp_path, ["agent"])
    path = checkpoint_file(tmp_path / CHECKPOINTS_DIR, streams.SESSIONS.name)
    path.parent.mkdir(mode=0o700)
    forged = Checkpoint(1, "0" * 64, "SESSIONS", "t", 1, {}).signed(
        Signer.generate("checkpointer", "checkpoint")
    )
    path.write_bytes(forged.line() + b"\n")
    with pytest.raises(SigningError, match=r"checkpoint 1: signed by key .* not in the pinned"):
        async with checkpointing(private_nats.url, tmp_path):
            pass
    assert json.loads(path.read_bytes())["number"] == 1  # left as it was, for the operator
    assert isinstance(read_keyset(tmp_path / "keys" / "keyset.json"), KeySet)
