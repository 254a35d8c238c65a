"""Document and local-checkout uploads against a real nats-server (and, for the checkout's
sandbox, a real broker process): the text in the tenant's object store and `DocumentLoaded`
on the log; over the limit 413, foreign sessions 404, hostile bundles refused, nothing stored
by any refusal."""

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_events import bus as verbs
from fleet_events import new_id, streams
from fleet_events.bus import Ping
from fleet_events.sandbox import GetFile
from fleet_events.session import SessionCreated, session_filter
from fleet_events.session_fold import FOLD
from fleet_gateway.routes.documents import MAX_DOCUMENT_BYTES
from fleet_harness.procs import Launcher
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

from .ws_kit import Gateway, serve, writer


@pytest.fixture
async def gateway(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> Any:
    async with serve(nats_server.url, tmp_path / "gw") as gw:
        yield gw


async def _new_session(js: JetStreamContext, tenant: str) -> str:
    session = new_id()
    await (await writer(js)).append(tenant, session, SessionCreated(title="docs"))
    return session


async def _log_size(js: JetStreamContext, tenant: str, session: str) -> int:
    store = await open_store(js, streams.SESSIONS)
    return len([r async for r in store.read_raw(session_filter(tenant, session))])


async def test_an_uploaded_document_is_in_the_tenants_store_and_active_in_the_session(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant = f"t{new_id()[:8]}"
    session = await _new_session(js, tenant)
    text = "Revenue grew 12% in Q3.\n" * 50
    async with gateway.client(tenant) as client:
        response = await client.post(
            f"/api/v1/sessions/{session}/documents",
            files={"file": ("q3-report.txt", text.encode(), "text/plain")},
            data={"title": "Q3"},
        )
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["alias"], body["chars"]) == ("q3-report", len(text))
    blobs = await JetStreamBlobs.open(js)
    assert await blobs.get(tenant, body["sha256"]) == text.encode()
    store = await open_store(js, streams.SESSIONS)
    state = (await store.load(session_filter(tenant, session), FOLD)).state
    assert state.image.active_document == "q3-report"
    (doc,) = state.image.documents
    assert (doc.source, doc.origin, doc.title) == ("upload", "q3-report.txt", "Q3")


async def test_refused_uploads_say_why_and_store_nothing(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant, other = f"t{new_id()[:8]}", f"o{new_id()[:8]}"
    session = await _new_session(js, tenant)
    before = await _log_size(js, tenant, session)
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        (tenant, session, {"file": ("big.txt", b"x" * (MAX_DOCUMENT_BYTES + 1))}, 413, ""),
        (
            tenant,
            session,
            {"file": ("scan.pdf", b"%PDF-1.7\xff\xfe\x00")},
            415,
            "unsupported_media_type",
        ),
        (tenant, session, {"file": ("bad name!.txt", b"hi")}, 422, "invalid_alias"),
        (tenant, new_id(), {"file": ("a.txt", b"hi")}, 404, "session_not_found"),
        (other, session, {"file": ("a.txt", b"another tenant's")}, 404, "session_not_found"),
    ]
    for who, where, files, status, code in cases:
        async with gateway.client(who) as client:
            response = await client.post(f"/api/v1/sessions/{where}/documents", files=files)
        assert response.status_code == status, (files, response.text)
        if code:
            assert response.json()["code"] == code
        assert response.json()["message"]
    assert await _log_size(js, tenant, session) == before
    assert await _log_size(js, other, session) == 0


def _tar(entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                archive.addfile(entry)
            else:
                info = tarfile.TarInfo(entry[0])
                info.size = len(entry[1])
                archive.addfile(info, io.BytesIO(entry[1]))
    return buffer.getvalue()


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info


async def test_hostile_checkout_bundles_are_refused_before_any_sandbox(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant = f"t{new_id()[:8]}"
    session = await _new_session(js, tenant)
    before = await _log_size(js, tenant, session)
    hostile = [
        _tar([("../outside.txt", b"x")]),
        _tar([("/etc/cron.d/job", b"x")]),
        _tar([("ok.txt", b"x"), _link("passwd", "/etc/passwd")]),
        b"not a tar at all",
    ]
    async with gateway.client(tenant) as client:
        for bundle in hostile:
            response = await client.post(
                f"/api/v1/sessions/{session}/checkout", files={"bundle": ("c.tgz", bundle)}
            )
            assert response.status_code == 422, response.text
            assert response.json()["code"] == "invalid_bundle"
    assert await _log_size(js, tenant, session) == before


@pytest.mark.slow
async def test_an_uploaded_checkout_becomes_the_sessions_sandbox_context(
    nc: Client, js: JetStreamContext, gateway: Gateway, launcher: Launcher, tmp_path: Path
) -> None:
    launcher.start("sandbox-broker", env={
        "FLEET_SANDBOX_ROOT": str(tmp_path / "sandboxes"),
        "FLEET_SANDBOX_VOLUMES": str(tmp_path / "volumes"),
    })  # fmt: skip

    async def broker_up() -> bool:
        try:
            await rpc.call_verb(nc, verbs.ping("sandbox-broker"), Ping(), timeout=0.5)
        except Exception:  # no responders while it starts
            return False
        return True

    await eventually(broker_up, timeout=60, what="the broker to answer ping")
    tenant = f"t{new_id()[:8]}"
    session = await _new_session(js, tenant)
    bundle = _tar([("README.md", b"# my project\n"), ("src/app.py", b"print('hi')\n")])
    async with gateway.client(tenant) as client:
        response = await client.post(
            f"/api/v1/sessions/{session}/checkout", files={"bundle": ("c.tgz", bundle)}
        )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["files"] == 2
    store = await open_store(js, streams.SESSIONS)
    state = (await store.load(session_filter(tenant, session), FOLD)).state
    assert state.image.interpreter is not None
    assert state.image.interpreter.sandbox == body["sandbox"]
    got = await rpc.call_verb(
        nc, verbs.GET_FILE,
        GetFile(request_id=new_id(), tenant=tenant, sandbox=body["sandbox"], path="src/app.py"),
        target=body["sandbox"], timeout=30,
    )  # fmt: skip
    assert got.data == b"print('hi')\n"
