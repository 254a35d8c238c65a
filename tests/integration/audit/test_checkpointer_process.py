"""`python -m fleet_mesh.checkpoints`: the checkpointer as a process on `fleet_mesh.service.run`.
It checkpoints and serves purges like `fleet up`'s role, stops cleanly on SIGTERM, answers no
ping (it is no service), and a missing setting stops it before it connects, naming it."""

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from msgspec.json import encode
from nats.errors import NoRespondersError
from nats.js import JetStreamContext

from fleet_cli.keys import ensure_keys, key_path
from fleet_events import bus, new_id, streams, subjects
from fleet_events.bus import Ping
from fleet_events.session import PurgeSession, TurnRequested, log_subject
from fleet_harness.procs import Replica, base_env
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.checkpoints import (
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_KEY_ENV,
    INTERVAL_ENV,
    KEYSET_ENV,
    checkpoint_file,
    read_checkpoints,
)
from fleet_mesh.keyfiles import read_signer
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

from .conftest import envelope


def _env(data: Path, nats_url: str) -> dict[str, str]:
    return {
        **base_env(nats_url, "checkpointer-0", "checkpointer"),
        CHECKPOINT_KEY_ENV: str(key_path(data, "checkpointer")),
        KEYSET_ENV: str(data / "keys" / "keyset.json"),
        CHECKPOINT_DIR_ENV: str(data / "checkpoints"),
        INTERVAL_ENV: "0.2",
    }


async def test_the_checkpointer_process_checkpoints_serves_purges_and_stops_on_sigterm(
    private_nats: NatsServer, private_js: JetStreamContext, tmp_path: Path
) -> None:
    ensure_keys(tmp_path, ["agent"])
    agent = await open_store(
        private_js, streams.SESSIONS, signer=read_signer(key_path(tmp_path, "agent"))
    )
    subject = log_subject("acme", new_id())
    appended = await agent.append(subject, envelope(TurnRequested(message="hi"), subject))
    process = Replica(
        "checkpointer", 0, [sys.executable, "-m", "fleet_mesh.checkpoints"],
        _env(tmp_path, private_nats.url), tmp_path / "checkpointer.log",
    ).start()  # fmt: skip
    try:
        path = checkpoint_file(tmp_path / "checkpoints", streams.SESSIONS.name)
        written = await eventually(
            lambda: read_checkpoints(path) or None, timeout=20, what="a checkpoint"
        )
        assert written[0].heads == {subject: (appended.seq, appended.hash)}
        nc = private_js._nc
        refusal = PurgeSession(request_id=new_id(), tenant="acme", session="nope", by="admin")
        with pytest.raises(rpc.RemoteError, match="only a deleted session is purged") as exc:
            await rpc.call_verb(nc, bus.PURGE_SESSION, refusal, timeout=10)
        assert exc.value.code == "bad_request"
        # a role, no service: nothing answers a ping in its name
        with pytest.raises(ValueError, match="unknown service 'checkpointer'"):
            bus.ping("checkpointer")
        with pytest.raises(NoRespondersError):
            await nc.request(subjects.rpc("checkpointer", "ping"), encode(Ping()), timeout=10)
    finally:
        code = process.stop(timeout=20)
    assert code == 0, process.logs()
    lines = [
        msgspec.json.decode(line) for line in process.logs().splitlines() if line.startswith("{")
    ]
    assert [line["msg"] for line in lines][-2:] == ["stopping", "stopped"]


def test_a_missing_setting_stops_the_checkpointer_naming_it(tmp_path: Path) -> None:
    env = _env(tmp_path, "nats://127.0.0.1:1")
    del env[CHECKPOINT_KEY_ENV]
    done = subprocess.run(
        [sys.executable, "-m", "fleet_mesh.checkpoints"],
        env=env, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith(f"checkpointer: bad setting: {CHECKPOINT_KEY_ENV}")
