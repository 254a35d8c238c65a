"""`/api/v1/runtime/volume/{tree,file}` against a real broker process: the caller's volumes are
listed and previewed (capped, a large file's first bytes, binary as base64), paths that would
leave the volume are refused before any request, a link out of the volume is not followed, and
another tenant's volume of the same name is not found. `/api/v1/optimization/*` answers 503,
never 404."""

import base64
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_events import bus
from fleet_events.bus import Ping
from fleet_gateway.routes.optimization import ROUTES
from fleet_harness.procs import Launcher
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.natsserver import NatsServer


@pytest.fixture
async def api(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(nats_server.url, tmp_path / "gw") as running:
        yield running


@pytest.fixture
async def volumes(nc: Client, launcher: Launcher, tmp_path: Path) -> Path:
    root = tmp_path / "volumes"
    launcher.start("sandbox-broker", env={
        "FLEET_SANDBOX_ROOT": str(tmp_path / "sandboxes"), "FLEET_SANDBOX_VOLUMES": str(root),
        "FLEET_SANDBOX_WARM_POOL_SIZE": "0",
    })  # fmt: skip

    async def up() -> bool:
        try:
            await rpc.call_verb(nc, bus.ping("sandbox-broker"), Ping(), timeout=0.5)
        except Exception:  # no responders while it starts
            return False
        return True

    await eventually(up, timeout=60, what="the broker to answer ping")
    return root


def _fill(root: Path, tenant: str) -> Path:
    """`<root>/<tenant>/notes/`: what a sandbox's durable volume holds on the broker's host."""
    volume = root / tenant / "notes"
    (volume / "memory").mkdir(parents=True)
    (volume / "readme.md").write_text("héllo " * 100)  # 700 bytes, 'é' is two
    (volume / "memory" / "a.txt").write_text("a")
    (volume / "blob.bin").write_bytes(bytes(range(256)))
    return volume


@pytest.mark.slow
async def test_the_tenants_volume_is_browsed_and_previewed_within_its_caps(
    api: Api, volumes: Path
) -> None:
    mine, other = tenant_id(), tenant_id()
    volume = _fill(volumes, mine)
    tree = await api.call("GET", "/api/v1/runtime/volume/tree", mine, params={"volume": "notes"})
    assert tree.status_code == 200, tree.text
    assert [(e["name"], e["kind"]) for e in tree.json()["entries"]] == [
        ("blob.bin", "file"), ("memory", "dir"), ("readme.md", "file"),
    ]  # fmt: skip
    assert tree.json()["truncated"] is False
    capped = await api.call(
        "GET", "/api/v1/runtime/volume/tree", mine, params={"volume": "notes", "max_entries": 2}
    )
    assert (len(capped.json()["entries"]), capped.json()["truncated"]) == (2, True)
    inner = await api.call(
        "GET", "/api/v1/runtime/volume/tree", mine, params={"volume": "notes", "path": "memory"}
    )
    assert [e["name"] for e in inner.json()["entries"]] == ["a.txt"]

    whole = await api.call(
        "GET", "/api/v1/runtime/volume/file", mine, params={"volume": "notes", "path": "readme.md"}
    )
    assert whole.status_code == 200, whole.text
    body = whole.json()
    assert (body["encoding"], body["truncated"], body["content"]) == (
        "utf-8",
        False,
        "héllo " * 100,
    )
    assert body["sha256"] == hashlib.sha256(("héllo " * 100).encode()).hexdigest()
    # a cap inside the second 'é' (its first byte is the 9th): the half character is left off
    cut = await api.call(
        "GET", "/api/v1/runtime/volume/file", mine,
        params={"volume": "notes", "path": "readme.md", "max_bytes": 9},
    )  # fmt: skip
    assert cut.status_code == 200, cut.text
    assert (cut.json()["content"], cut.json()["truncated"], cut.json()["bytes"]) == (
        "héllo h", True, 8,
    )  # fmt: skip
    binary = await api.call(
        "GET", "/api/v1/runtime/volume/file", mine, params={"volume": "notes", "path": "blob.bin"}
    )
    assert binary.json()["encoding"] == "base64"
    assert base64.b64decode(binary.json()["content"]) == bytes(range(256))
    too_big = await api.call(
        "GET", "/api/v1/runtime/volume/file", mine,
        params={"volume": "notes", "path": "readme.md", "max_bytes": 10**7},
    )  # fmt: skip
    assert too_big.status_code == 422
    assert "max_bytes" in too_big.json()["message"]

    # another tenant's volume of the same name is not found, nor are its files
    theirs = await api.call("GET", "/api/v1/runtime/volume/tree", other, params={"volume": "notes"})
    assert (theirs.status_code, theirs.json()["code"]) == (404, "volume_path_not_found")
    read = await api.call(
        "GET", "/api/v1/runtime/volume/file", other, params={"volume": "notes", "path": "readme.md"}
    )
    assert read.status_code == 404
    assert (volume / "readme.md").exists()


@pytest.mark.slow
async def test_paths_out_of_the_volume_are_refused_and_links_not_followed(
    api: Api, volumes: Path
) -> None:
    mine, other = tenant_id(), tenant_id()
    volume = _fill(volumes, mine)
    secret = _fill(volumes, other) / "readme.md"
    os.symlink(secret, volume / "link.md")
    os.symlink(secret.parent, volume / "linkdir")
    for path in ("../x", f"../../{other}/notes/readme.md", "/etc/passwd", "a\\..\\b", "a/../../b"):
        refused = await api.call(
            "GET", "/api/v1/runtime/volume/file", mine, params={"volume": "notes", "path": path}
        )
        assert (refused.status_code, refused.json()["code"]) == (422, "invalid_volume_path"), path
    bad_volume = await api.call("GET", "/api/v1/runtime/volume/tree", mine, params={"volume": "."})
    assert (bad_volume.status_code, bad_volume.json()["code"]) == (422, "invalid_volume")
    for route, path in (("file", "link.md"), ("tree", "linkdir"), ("file", "linkdir/readme.md")):
        followed = await api.call(
            "GET", f"/api/v1/runtime/volume/{route}", mine, params={"volume": "notes", "path": path}
        )
        assert followed.status_code == 404, (route, path, followed.text)
        assert "héllo" not in followed.text


async def test_optimization_routes_answer_503_with_the_reason_never_404(api: Api) -> None:
    tenant = tenant_id()
    for method, path in ROUTES:
        url = "/api/v1/optimization" + path.replace("{run_id}", "r1").replace("{dataset_id}", "d1")
        response = await api.call(method, url, tenant)
        assert response.status_code == 503, (method, url, response.text)
        assert response.json()["code"] == "optimization_unavailable"
        assert "quality service" in response.json()["message"]
        anonymous = await api.client.request(method, url)
        assert anonymous.status_code == 401, (method, url)
