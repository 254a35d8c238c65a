"""The upload allowance is charged before anything is stored, and given back when the upload
then fails (the object store or the sandbox broker failing after the charge), so a failure
the tenant did not cause costs it nothing: on a real nats-server, a real object store made to
fail (deleted under the gateway) and no sandbox broker running."""

import io
import tarfile
from pathlib import Path

import msgspec
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import running_api, tenant_id

from fleet_events import new_id, streams
from fleet_events.session import SessionCreated
from fleet_gateway.quotas import Allowance
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer

from .ws_kit import writer

ALLOWANCE = 1000
WINDOW_S = 1e7  # the allowance barely refills within a test


async def _left(js: JetStreamContext, tenant: str) -> float:
    kv = await js.key_value(streams.GATEWAY.bucket)
    entry = await kv.get(f"uploads.{tenant}")
    return msgspec.json.decode(entry.value or b"", type=Allowance).bytes


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def test_a_checkout_the_broker_cannot_start_is_refunded(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(
        nats_server.url, tmp_path, tenant_upload_bytes=ALLOWANCE, tenant_upload_window_s=WINDOW_S
    ) as api:
        tenant, session = tenant_id(), new_id()
        await (await writer(js)).append(tenant, session, SessionCreated(title="q"))
        bundle = {"bundle": ("c.tgz", _tar({"a.py": b"x" * 700}), "application/gzip")}
        for _ in range(2):  # 700 + 700 > 1000: without the refund the second is 429
            failed = await api.call(
                "POST", f"/api/v1/sessions/{session}/checkout", tenant, files=bundle
            )
            assert (failed.status_code, failed.json()["code"]) == (503, "sandbox_unavailable")
            assert await _left(js, tenant) >= ALLOWANCE - 1  # given back
        # a charge that stands still costs: the allowance is real
        ok = await api.call(
            "POST", f"/api/v1/sessions/{session}/documents", tenant,
            files={"file": ("n.txt", b"y" * 600, "text/plain")},
        )  # fmt: skip
        assert ok.status_code == 201, ok.text
        assert await _left(js, tenant) < ALLOWANCE - 599


async def test_a_document_the_object_store_fails_to_keep_is_refunded(
    private_nats: NatsServer, tmp_path: Path
) -> None:
    nc = await connect(private_nats.url, name="refund-test")
    js = nc.jetstream()
    await bootstrap(js)
    try:
        async with running_api(
            private_nats.url,
            tmp_path,
            tenant_upload_bytes=ALLOWANCE,
            tenant_upload_window_s=WINDOW_S,
        ) as api:
            tenant, session = tenant_id(), new_id()
            await (await writer(js)).append(tenant, session, SessionCreated(title="q"))
            await js.delete_object_store(streams.BLOBS.bucket)  # the store fails from here
            doc = {"file": ("n.txt", b"z" * 700, "text/plain")}
            for _ in range(2):
                failed = await api.call(
                    "POST", f"/api/v1/sessions/{session}/documents", tenant, files=doc
                )
                assert failed.status_code == 503, failed.text
                assert await _left(js, tenant) >= ALLOWANCE - 1
    finally:
        await nc.close()
