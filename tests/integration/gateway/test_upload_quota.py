"""The per-tenant upload allowance on a real nats-server, shared by two gateway replicas:
documents and checkouts draw from it, a short allowance is 429 with `Retry-After` and a
message naming the bytes, an upload bigger than the whole allowance is 413, and a refusal
stores nothing (no blob, no event) and leaves other tenants untouched."""

import hashlib
import io
import tarfile
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import running_api, tenant_id

from fleet_events import new_id, streams
from fleet_events.session import SessionCreated, session_filter
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

from .ws_kit import writer

ALLOWANCE = 1000


async def _session(js: JetStreamContext, tenant: str) -> str:
    session = new_id()
    await (await writer(js)).append(tenant, session, SessionCreated(title="q"))
    return session


async def _events(js: JetStreamContext, tenant: str, session: str) -> int:
    store = await open_store(js, streams.SESSIONS)
    return len([r async for r in store.read_raw(session_filter(tenant, session))])


def _doc(data: bytes) -> dict[str, tuple[str, bytes, str]]:
    return {"file": ("notes.txt", data, "text/plain")}


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def test_the_allowance_is_shared_by_replicas_and_a_short_one_is_429_storing_nothing(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    settings = {"tenant_upload_bytes": ALLOWANCE, "tenant_upload_window_s": 3600.0}
    async with (
        running_api(nats_server.url, tmp_path, replica="gateway-a", **settings) as a,
        running_api(nats_server.url, tmp_path, replica="gateway-b", **settings) as b,
    ):
        tenant, other = tenant_id(), tenant_id()
        session, theirs = await _session(js, tenant), await _session(js, other)
        first = await a.call(
            "POST", f"/api/v1/sessions/{session}/documents", tenant, files=_doc(b"a" * 600)
        )
        assert first.status_code == 201, first.text
        before = await _events(js, tenant, session)
        refused_data = b"b" * 600
        second = await b.call(
            "POST", f"/api/v1/sessions/{session}/documents", tenant, files=_doc(refused_data)
        )
        assert second.status_code == 429, second.text
        body = second.json()
        assert body["code"] == "upload_quota_exceeded"
        # 400 bytes left, and what refilled since (1000 bytes per 3600 s: 0.28 a second)
        left = body["details"]["remaining_bytes"]
        assert 400 <= left <= 420, left
        assert f"{tenant!r} has {left} of its {ALLOWANCE} upload bytes" in body["message"]
        assert "this document is 600 bytes" in body["message"]
        # 200 bytes short at 1000 bytes per 3600 s: 720 s, less what refilled meanwhile
        assert 650 <= int(second.headers["Retry-After"]) <= 720
        assert await _events(js, tenant, session) == before
        blobs = await JetStreamBlobs.open(js)
        with pytest.raises(LookupError):
            await blobs.get(tenant, hashlib.sha256(refused_data).hexdigest())

        # a checkout draws from the same allowance (unpacked bytes), refused before any
        # sandbox is asked for (no broker runs here)
        checkout = await a.call(
            "POST", f"/api/v1/sessions/{session}/checkout", tenant,
            files={"bundle": ("c.tgz", _tar({"a.txt": b"x" * 500}))},
        )  # fmt: skip
        assert checkout.status_code == 429, checkout.text
        assert "this checkout is 500 bytes" in checkout.json()["message"]

        # what is left still goes through; another tenant's allowance is its own
        small = await b.call(
            "POST", f"/api/v1/sessions/{session}/documents", tenant, files=_doc(b"c" * 400)
        )
        assert small.status_code == 201, small.text
        theirs_up = await a.call(
            "POST", f"/api/v1/sessions/{theirs}/documents", other, files=_doc(b"d" * 900)
        )
        assert theirs_up.status_code == 201, theirs_up.text


async def test_an_upload_bigger_than_the_whole_allowance_is_413_and_refusals_cost_nothing(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path, tenant_upload_bytes=ALLOWANCE) as api:
        tenant = tenant_id()
        session = await _session(js, tenant)
        before = await _events(js, tenant, session)
        over = await api.call(
            "POST", f"/api/v1/sessions/{session}/documents", tenant,
            files=_doc(b"a" * (ALLOWANCE + 1)),
        )  # fmt: skip
        assert over.status_code == 413, over.text
        assert over.json()["code"] == "upload_over_quota"
        assert "FLEET_GATEWAY_TENANT_UPLOAD_BYTES" in over.json()["message"]
        # refused for another reason (not UTF-8, unknown session): no allowance spent
        for where, data in ((session, b"\xff" * 900), (new_id(), b"a" * 900)):
            response = await api.call(
                "POST", f"/api/v1/sessions/{where}/documents", tenant, files=_doc(data)
            )
            assert response.status_code in (404, 415), response.text
        assert await _events(js, tenant, session) == before
        whole = await api.call(
            "POST", f"/api/v1/sessions/{session}/documents", tenant,
            files=_doc(b"a" * ALLOWANCE),
        )  # fmt: skip
        assert whole.status_code == 201, whole.text
