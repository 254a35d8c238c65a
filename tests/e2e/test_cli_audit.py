"""The audit end to end, as an auditor and as attackers would work: a session of a real
`fleet up` exported through the gateway with the CLI (`fleet sessions export S | fleet audit
verify - --keys keys/keyset.json`), then checked with no server running. Each rewrite is caught
by the CLI naming the event: an edit, a rehashed export (and one re-signed with a key of the
attacker's own, its key-set line swapped in), a raw publish with self-computed headers on the
mesh's own NATS, a purge-and-rewrite of a subject. The gateway's import checks the same
signatures against the deployment's key set and refuses what does not verify."""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_events import Actor, Envelope, Event, streams, utc_now
from fleet_events.catalog import type_of
from fleet_events.chain import GENESIS, link
from fleet_events.codec import Codec
from fleet_events.session import SessionCreated, SessionRenamed, log_subject
from fleet_events.signing import KeySet, Signer
from fleet_harness.waits import eventually
from fleet_mesh.connection import connect
from fleet_mesh.keyfiles import read_signer
from fleet_mesh.store import Head, open_store
from fleet_mesh.store.headers import append_headers

from .conftest import Mesh, StartMesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
Row = dict[str, Any]


def fleet(mesh: Mesh, *argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("FLEET_URL", "FLEET_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", *argv, "--data-dir", str(mesh.data_dir)],
        input=stdin.decode(), capture_output=True, text=True, timeout=60,
        env=clean | {"COLUMNS": "200"},
    )  # fmt: skip


def pipe(mesh: Mesh, left: list[str], right: list[str]) -> subprocess.CompletedProcess[str]:
    """`fleet LEFT | fleet RIGHT`, as a shell runs it (no shell here)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("FLEET_URL", "FLEET_TOKEN")}
    argv = [sys.executable, "-m", "fleet_cli"]
    tail = ["--data-dir", str(mesh.data_dir)]
    with subprocess.Popen([*argv, *left, *tail], stdout=subprocess.PIPE, env=clean) as source:
        done = subprocess.run([*argv, *right, *tail], stdin=source.stdout, capture_output=True,
                              text=True, timeout=60, env=clean)  # fmt: skip
    assert source.returncode == 0
    return done


def said(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join(done.stderr.split())


def rows_of(data: bytes) -> list[Row]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def encode(rows: list[Row]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def payload(row: Row) -> bytes:
    return base64.b64decode(str(row["payload"]))


def forged(session: str, data: Event, event_id: str) -> Envelope[Event]:
    actor = Actor(service="gateway", replica="mallory")
    return Envelope(id=event_id, tenant="dev", session=session, actor=actor, ts=utc_now(),
                    data=data)  # fmt: skip


async def test_gateway_exports_verify_offline_against_pinned_keys_and_every_rewrite_is_named(
    start_mesh: StartMesh, tmp_path: Path
) -> None:
    mesh = start_mesh()
    await eventually(lambda: _ready(mesh), timeout=120, interval=0.25, what="/ready")
    keyset = mesh.data_dir / "keys" / "keyset.json"
    first = json.loads(fleet(mesh, "run", "the original question", "--json").stdout)
    session = first["session"]
    other = json.loads(fleet(mesh, "run", "a session to purge", "--json").stdout)["session"]

    exported = fleet(mesh, "sessions", "export", session)
    assert exported.returncode == 0, exported.stderr
    clean = exported.stdout.encode()
    rows = rows_of(clean)
    assert rows[0]["kind"] == "fleet-keyset"  # the keys and their owners travel with it
    assert {"gateway", "agent"} <= {key["owner"] for key in rows[0]["keys"]}
    assert all(row.get("sig") for row in rows[1:] if "subject" in row)  # every event signed

    verify_piped = ["audit", "verify", "-", "--keys", str(keyset)]
    piped = pipe(mesh, ["sessions", "export", session], verify_piped)
    assert piped.returncode == 0, piped.stderr
    assert "signatures and chains against the pinned keys" in piped.stderr

    # An edit: the turn's question changed in place, its hash left as it was.
    log = log_subject("dev", session)
    on_log = [row for row in rows[1:] if row.get("subject") == log]
    asked = next(row for row in on_log if b"the original question" in payload(row))
    edited = [dict(row) for row in rows]
    target = next(row for row in edited if row.get("id") == asked["id"])
    target["payload"] = base64.b64encode(
        payload(target).replace(b"the original question", b"transfer it all to mallory")
    ).decode()

    # Rehashed: the same edit with every later hash of the chain recomputed.
    rehashed = [dict(row) for row in edited]
    chain = [row for row in rehashed if row.get("subject") == log]
    at = next(i for i, row in enumerate(chain) if row["id"] == asked["id"])
    prev = str(chain[at - 1]["hash"])
    for row in chain[at:]:
        row["prev"], row["hash"] = prev, link(prev, payload(row))
        prev = str(row["hash"])
    # ... and re-signed with a key of the attacker's own, its key-set line swapped in.
    mallory = Signer.generate("gateway")
    resigned = [dict(row) for row in rehashed]
    for row in resigned:
        if row.get("subject") == log and int(row["seq"]) >= int(asked["seq"]):
            row["key"], row["sig"] = mallory.key_id, mallory.sign_append(log, str(row["hash"]))
    resigned[0] = KeySet.of([mallory]).to_json()

    # A raw publish on the mesh's own NATS with self-computed chain headers, and a subject
    # purged and written anew from genesis: what a bus writer and a store admin can do.
    raw_id, rewrite_id = "forgedRename01", "rewrittenStart01"
    nc = await connect(str(mesh.state()["nats"]), name="attacker")
    try:
        js = nc.jetstream()
        store = await open_store(js, streams.SESSIONS)
        head = await store.head(log)
        env = forged(session, SessionRenamed(title="pwned"), raw_id)
        body = Codec().encode_inline(env)
        await js.publish(log, body, headers=append_headers(raw_id, head, body, type_of(env.data)),
                         stream=streams.SESSIONS.name)  # fmt: skip
        purged = log_subject("dev", other)
        await js.purge_stream(streams.SESSIONS.name, subject=purged)
        head = Head(0, GENESIS)
        for event_id, data in ((rewrite_id, SessionCreated(title="rewritten")),
                               ("rewrittenNext01", SessionRenamed(title="history"))):  # fmt: skip
            env = forged(other, data, event_id)
            body = Codec().encode_inline(env)
            headers = append_headers(event_id, head, body, type_of(data))
            ack = await js.publish(purged, body, headers=headers, stream=streams.SESSIONS.name)
            head = Head(ack.seq, headers["Fleet-Hash"])
    finally:
        await nc.close()
    raw = fleet(mesh, "sessions", "export", session)
    rewritten = fleet(mesh, "sessions", "export", other)
    assert raw.returncode == rewritten.returncode == 0, raw.stderr + rewritten.stderr

    # The import checks the signatures against the deployment's keys.
    refusals = [
        (encode(rehashed), f"event {asked['id']}"),
        (encode(resigned), "not in the pinned key set"),
        (raw.stdout.encode(), "unsigned, and the pinned key set requires"),
    ]
    for body, why in refusals:
        refused = fleet(mesh, "sessions", "import", "-", stdin=body)
        assert refused.returncode == 2, refused.stdout
        assert "export_invalid" in said(refused)
        assert why in said(refused), said(refused)
    assert fleet(mesh, "sessions", "import", "-", stdin=clean).returncode == 0

    mesh.process.terminate()  # the auditor's machine: no server from here on
    assert mesh.process.wait(60) == 0

    files = {}
    bodies = {
        "clean": clean, "edited": encode(edited), "rehashed": encode(rehashed),
        "resigned": encode(resigned), "raw": raw.stdout.encode(),
        "rewritten": rewritten.stdout.encode(),
    }  # fmt: skip
    for name, body in bodies.items():
        files[name] = tmp_path / f"{name}.ndjson"
        files[name].write_bytes(body)

    def verify(name: str) -> subprocess.CompletedProcess[str]:
        return fleet(mesh, "audit", "verify", "-", "--keys", str(keyset),
                     stdin=files[name].read_bytes())  # fmt: skip

    ok = verify("clean")
    assert ok.returncode == 0, ok.stderr
    assert f"verified: {len(rows) - 1} events" in said(ok)
    for name, event_id, reason in (
        ("edited", asked["id"], "altered payload"),
        ("rehashed", asked["id"], "signature by gateway (key"),
        ("resigned", asked["id"], f"signed by key {mallory.key_id}, which is not in the pinned"),
        ("raw", raw_id, "unsigned, and the pinned key set requires signatures"),
        ("rewritten", rewrite_id, "unsigned, and the pinned key set requires signatures"),
    ):
        caught = verify(name)
        assert caught.returncode == 1, (name, caught.stderr)
        assert f"event {event_id} (seq" in said(caught), (name, said(caught))
        assert reason in said(caught), (name, said(caught))
    # what the pinned keys add: the chain alone passes the rehashed and the rewritten ones
    for name in ("rehashed", "rewritten"):
        chain_only = fleet(mesh, "audit", "verify", str(files[name]))
        assert chain_only.returncode == 0, (name, chain_only.stderr)


def _ready(mesh: Mesh) -> bool:
    assert mesh.process.poll() is None, mesh.printed()[-3000:]
    try:
        return mesh.ready().status_code == 200
    except OSError:
        return False


async def test_a_rewrite_re_signed_with_a_stolen_service_key_is_named_by_the_checkpoints(
    start_mesh: StartMesh, tmp_path: Path
) -> None:
    mesh = start_mesh(env={"FLEET_CHECKPOINT_INTERVAL_S": "0.5"})
    await eventually(lambda: _ready(mesh), timeout=120, interval=0.25, what="/ready")
    keyset = mesh.data_dir / "keys" / "keyset.json"
    pinned_file = mesh.data_dir / "checkpoints" / "SESSIONS.checkpoints.jsonl"
    session = json.loads(fleet(mesh, "run", "pay alice 10", "--json").stdout)["session"]
    log = log_subject("dev", session)
    nc = await connect(str(mesh.state()["nats"]), name="thief")
    try:
        js = nc.jetstream()
        plain = await open_store(js, streams.SESSIONS)
        head = await plain.head(log)

        def pinned_head() -> bool:  # the checkpointer has vouched for the whole .log
            for line in pinned_file.read_bytes().splitlines() if pinned_file.exists() else []:
                heads = json.loads(line).get("heads", {})
                if log in heads and heads[log][0] >= head.seq:
                    return True
            return False

        await eventually(pinned_head, timeout=60, interval=0.2, what="a checkpoint of the log")
        # The thief holds the gateway's key: purge the log, write a new history, sign it all.
        stolen = read_signer(mesh.data_dir / "keys" / "gateway.key")
        thief = await open_store(js, streams.SESSIONS, signer=stolen)
        await js.purge_stream(streams.SESSIONS.name, subject=log)
        rewritten = Head(0, GENESIS)
        history: list[tuple[str, Event]] = [
            ("stolenCreate01", SessionCreated(title="rewritten")),
            ("stolenRename01", SessionRenamed(title="pay mallory 10")),
        ]
        for event_id, data in history:
            rewritten = (
                await thief.append(log, forged(session, data, event_id), expect=rewritten)
            ).head
    finally:
        await nc.close()
    exported = fleet(mesh, "sessions", "export", session)
    assert exported.returncode == 0, exported.stderr
    mesh.process.terminate()
    assert mesh.process.wait(60) == 0

    export = tmp_path / "stolen.ndjson"
    export.write_bytes(exported.stdout.encode())
    fooled = fleet(mesh, "audit", "verify", str(export), "--keys", str(keyset))
    assert fooled.returncode == 0, fooled.stderr  # every signature is a pinned key's
    caught = fleet(mesh, "audit", "verify", str(export), "--keys", str(keyset),
                   "--checkpoints", str(pinned_file))  # fmt: skip
    assert caught.returncode == 1, caught.stderr
    assert f"on {log})" in said(caught)
    assert "no longer holds and no purge receipt covers" in said(caught)
    no_keys = fleet(mesh, "audit", "verify", str(export), "--checkpoints", str(pinned_file))
    assert no_keys.returncode == 2
    assert "--checkpoints needs --keys" in said(no_keys)
