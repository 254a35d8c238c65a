"""Export, import and restore through the gateway against a real nats-server: the export
verifies on its own, one flipped byte is named, an import (into another tenant, payloads
included) restores the same state, a tampered import stores nothing, tenants stay apart."""

import base64
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_events import bus as verbs
from fleet_events import new_id, streams
from fleet_events.bus import Ping
from fleet_events.sandbox import CreateSandbox, Execute, OpenContext
from fleet_events.session import (
    CoreMemoryChanged,
    DocumentLoaded,
    DocumentRef,
    InterpreterState,
    SandboxAttached,
    SessionCreated,
    SessionImported,
    SessionRenamed,
    TurnCompleted,
    TurnRequested,
    session_filter,
)
from fleet_events.session_fold import FOLD, SessionState
from fleet_harness.procs import Launcher
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.bundle import read_bundle
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

from .ws_kit import Gateway, serve, writer


@pytest.fixture
async def gateway(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> Any:
    async with serve(nats_server.url, tmp_path / "gw") as gw:
        yield gw


async def _state(js: JetStreamContext, tenant: str, session: str) -> SessionState:
    store = await open_store(js, streams.SESSIONS)
    return (await store.load(session_filter(tenant, session), FOLD)).state


async def _session(js: JetStreamContext, tenant: str) -> str:
    """A session with history, memory, a document (its text in the object store), a sandbox,
    and an answer too big to store inline (offloaded)."""
    session = new_id()
    log = await writer(js)
    blobs = await JetStreamBlobs.open(js)
    doc = await blobs.put(tenant, b"the quarterly report text " * 100)
    turn = new_id()
    await log.append(tenant, session, SessionCreated(title="source"))
    await log.append(tenant, session, TurnRequested(message="summarise"), turn=turn)
    await log.append(tenant, session, DocumentLoaded(document=DocumentRef(
        alias="report", source="upload", origin="report.txt", blob=doc, chars=2600,
    )))  # fmt: skip
    await log.append(tenant, session, CoreMemoryChanged(block="human", op="append", value="Ann"))
    await log.append(tenant, session, SandboxAttached(interpreter=InterpreterState(
        sandbox="sb-gone", workspace="/w", volume="vol", volume_subpath="s1",
    )))  # fmt: skip
    await log.append(tenant, session, TurnCompleted(answer="y" * 300_000), turn=turn)
    return session


def _comparable(state: SessionState) -> Any:
    """The image with blob object names (which carry the tenant) reduced to their digests."""
    image = msgspec.to_builtins(state.image)
    for doc in image.get("documents", []):
        doc["blob"].pop("object")
    return image


async def _export(gw: Gateway, tenant: str, session: str) -> list[bytes]:
    async with gw.client(tenant) as client:
        response = await client.post(f"/api/v1/sessions/{session}/export")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return response.content.splitlines()


async def test_an_export_verifies_on_its_own_and_names_the_event_a_flipped_byte_is_in(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant = f"t{new_id()[:8]}"
    session = await _session(js, tenant)
    lines = await _export(gateway, tenant, session)
    bundle = read_bundle(lines)
    assert bundle.ok, bundle.fault
    assert len(bundle.events) == 6
    assert len(bundle.blobs) == 2  # the document and the offloaded answer
    # flip one byte of the fourth event's stored bytes
    row = json.loads(lines[3])
    payload = bytearray(base64.b64decode(row["payload"]))
    payload[len(payload) // 2] ^= 0x01
    row["payload"] = base64.b64encode(bytes(payload)).decode()
    tampered = [*lines[:3], json.dumps(row).encode(), *lines[4:]]
    fault = read_bundle(tampered).fault
    assert fault is not None
    assert (fault.seq, fault.event_id) == (row["seq"], row["id"])
    # a blob swapped for other bytes is named too
    blob_at = next(i for i, line in enumerate(lines) if b'"kind":"blob"' in line)
    blob = json.loads(lines[blob_at])
    blob["data"] = base64.b64encode(b"other bytes").decode()
    swapped = [*lines[:blob_at], json.dumps(blob).encode(), *lines[blob_at + 1 :]]
    assert not read_bundle(swapped).ok
    # and one left out
    assert not read_bundle([*lines[:blob_at], *lines[blob_at + 1 :]]).ok


async def test_import_into_another_tenant_restores_the_same_state_with_its_payloads(
    gateway: Gateway, js: JetStreamContext
) -> None:
    source_tenant, target_tenant = f"a{new_id()[:8]}", f"b{new_id()[:8]}"
    source = await _session(js, source_tenant)
    lines = await _export(gateway, source_tenant, source)
    async with gateway.client(target_tenant) as client:
        response = await client.post(
            "/api/v1/sessions/import",
            content=b"\n".join(lines),
            headers={"content-type": "application/x-ndjson"},
        )
    assert response.status_code == 201, response.text
    body = response.json()
    imported = body["session_id"]
    assert body["source_session"] == source
    bundle = read_bundle(lines)
    log_head = [r for r in bundle.events if r.subject.endswith(".log")][-1].hash
    assert body["source_head_hash"] == log_head
    before, after = (
        await _state(js, source_tenant, source),
        await _state(js, target_tenant, imported),
    )
    # the same state, but for the sandbox: the source's id (another tenant's sandbox) and its
    # host workspace path are not carried over; what a fresh one is made like is
    assert before.image.interpreter is not None
    assert after.image.interpreter == msgspec.structs.replace(
        before.image.interpreter, sandbox=None, workspace=""
    )
    assert (after.image.interpreter.volume, after.image.interpreter.volume_subpath) == (
        "vol", "s1",
    )  # fmt: skip
    unsandboxed = msgspec.structs.replace(before, image=msgspec.structs.replace(
        before.image, interpreter=after.image.interpreter,
    ))  # fmt: skip
    assert _comparable(after) == _comparable(unsandboxed)
    assert after.image.turns[0].answer == "y" * 300_000
    # the document's text now lives in the target tenant, under the reference the state holds
    (doc,) = after.image.documents
    assert doc.blob.object.startswith(f"{target_tenant}/")
    blobs = await JetStreamBlobs.open(js)
    assert await blobs.get(target_tenant, doc.blob.sha256) == b"the quarterly report text " * 100
    # the new log opens a chain of its own: created, then imported (with the source's head)
    store = await open_store(js, streams.SESSIONS)
    events = [e async for e in store.replay(session_filter(target_tenant, imported))]
    assert [type(e.envelope.data) for e in events] == [SessionCreated, SessionImported]
    assert events[1].envelope.data.source_head_hash == log_head


async def test_a_tampered_import_is_refused_naming_the_event_and_stores_nothing(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant, target = f"a{new_id()[:8]}", f"b{new_id()[:8]}"
    session = await _session(js, tenant)
    lines = await _export(gateway, tenant, session)
    row = json.loads(lines[2])
    envelope = json.loads(base64.b64decode(row["payload"]))
    envelope["data"]["document"]["origin"] = "/etc/passwd"  # an edit, not re-hashed
    row["payload"] = base64.b64encode(json.dumps(envelope).encode()).decode()
    tampered = [*lines[:2], json.dumps(row).encode(), *lines[3:]]
    async with gateway.client(target) as client:
        response = await client.post("/api/v1/sessions/import", content=b"\n".join(tampered))
    assert response.status_code == 422
    error = response.json()
    assert error["code"] == "export_invalid"
    assert (error["details"]["seq"], error["details"]["event"]) == (row["seq"], row["id"])
    store = await open_store(js, streams.SESSIONS)
    assert [r async for r in store.read_raw(f"fleet.session.{target}.>")] == []


async def test_deeply_nested_json_is_a_422_naming_the_line_and_stores_nothing(
    gateway: Gateway, js: JetStreamContext
) -> None:
    # the import answered 500 (a RecursionError in the JSON reader) to this
    target = f"b{new_id()[:8]}"
    deep = b'{"subject": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with gateway.client(target) as client:
        response = await client.post("/api/v1/sessions/import", content=deep)
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["code"] == "export_invalid"
    assert "line 1 nests JSON deeper than any export does" in error["message"]
    store = await open_store(js, streams.SESSIONS)
    assert [r async for r in store.read_raw(f"fleet.session.{target}.>")] == []


async def test_another_tenants_session_cannot_be_exported_or_restored(
    gateway: Gateway, js: JetStreamContext
) -> None:
    owner, other = f"a{new_id()[:8]}", f"b{new_id()[:8]}"
    session = await _session(js, owner)
    async with gateway.client(other) as client:
        for path in ("export", "restore"):
            response = await client.post(f"/api/v1/sessions/{session}/{path}")
            assert response.status_code == 404, (path, response.text)
            assert response.json()["code"] == "session_not_found"
    async with gateway.client(owner) as client:  # no token: 401
        client.headers.pop("Authorization")
        assert (await client.post(f"/api/v1/sessions/{session}/export")).status_code == 401


async def test_restore_records_the_state_up_to_a_sequence(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant, session = f"t{new_id()[:8]}", new_id()
    log = await writer(js)
    await log.append(tenant, session, SessionCreated(title="t"))
    keep = await log.append(tenant, session, CoreMemoryChanged(block="human", op="append",
                                                               value="Ann"))  # fmt: skip
    await log.append(tenant, session, CoreMemoryChanged(block="human", op="replace", value="Bob"))
    await log.append(tenant, session, SessionRenamed(title="later"))
    async with gateway.client(tenant) as client:
        response = await client.post(
            f"/api/v1/sessions/{session}/restore", json={"upto_seq": keep, "reason": "undo"}
        )
    assert response.status_code == 200, response.text
    assert response.json()["upto_seq"] == keep
    state = await _state(js, tenant, session)
    assert state.image.core_memory.human == "Ann"  # what it was at `keep`, not "Bob"


def _broker_env(root: Path, volumes: Path) -> dict[str, str]:
    return {"FLEET_SANDBOX_ROOT": str(root), "FLEET_SANDBOX_VOLUMES": str(volumes)}


@pytest.mark.slow
async def test_restore_of_a_session_whose_sandbox_is_gone_replaces_it_on_the_same_volume(
    nc: Client, js: JetStreamContext, gateway: Gateway, launcher: Launcher, tmp_path: Path
) -> None:
    volumes = tmp_path / "volumes"
    (first,) = launcher.start("sandbox-broker", env=_broker_env(tmp_path / "a", volumes))
    await _broker_up(nc, "sandbox-broker-0")
    tenant, session = f"t{new_id()[:8]}", new_id()
    info = await rpc.call_verb(
        nc, verbs.CREATE_SANDBOX,
        CreateSandbox(request_id=new_id(), tenant=tenant, volume="vol", volume_subpath="s1"),
        timeout=60,
    )  # fmt: skip
    notes = f"{info.workspace}/volume/notes.txt"
    wrote = await _cell(nc, tenant, info.sandbox, f"open({notes!r}, 'w').write('kept')")
    assert (wrote.kind, wrote.value) == ("result", 4)
    log = await writer(js)
    await log.append(tenant, session, SessionCreated(title="t"))
    await log.append(tenant, session, SandboxAttached(interpreter=InterpreterState(
        sandbox=info.sandbox, workspace=info.workspace, volume="vol", volume_subpath="s1",
    )))  # fmt: skip
    first.kill()  # the sandbox goes with its broker; another broker cannot reach its files
    launcher.start("sandbox-broker", env=_broker_env(tmp_path / "b", volumes))
    await _broker_up(nc, "sandbox-broker-1")
    async with gateway.client(tenant) as client:
        response = await client.post(f"/api/v1/sessions/{session}/restore")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["replaced"] == info.sandbox
    assert body["sandbox"] not in (None, info.sandbox)
    state = await _state(js, tenant, session)
    assert state.image.interpreter is not None
    assert state.image.interpreter.sandbox == body["sandbox"]
    assert (state.image.interpreter.volume, state.image.interpreter.volume_subpath) == (
        "vol", "s1",
    )  # fmt: skip
    assert state.image.interpreter.workspace == ""  # the host path is the broker's (issue 27)
    # REPL memory is gone, the volume's files are not (a cell runs in its workspace)
    read = await _cell(nc, tenant, body["sandbox"], "open('volume/notes.txt').read()")
    assert (read.kind, read.value) == ("result", "kept")


async def _cell(nc: Client, tenant: str, sandbox: str, code: str) -> Any:
    context = new_id()
    await rpc.call_verb(
        nc, verbs.OPEN_CONTEXT,
        OpenContext(request_id=new_id(), tenant=tenant, sandbox=sandbox, context=context),
        target=sandbox, timeout=30,
    )  # fmt: skip
    return await rpc.call_verb(
        nc, verbs.EXECUTE,
        Execute(request_id=new_id(), tenant=tenant, sandbox=sandbox, context=context, code=code),
        target=sandbox, timeout=60,
    )  # fmt: skip


async def _broker_up(nc: Client, replica: str) -> None:
    async def up() -> bool:
        try:
            pong = await rpc.call_verb(nc, verbs.ping("sandbox-broker"), Ping(), timeout=0.5)
        except Exception:  # no responders while it starts
            return False
        return pong.replica == replica

    await eventually(up, timeout=60, interval=0.05, what=f"{replica} to answer ping")
