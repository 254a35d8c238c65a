"""The built UI served by the gateway: files from ui/dist only, the SPA's routes fall back to
index.html, and nothing under /api, /health, /ready or the sockets is ever answered by it."""

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fleet_gateway import errors
from fleet_gateway.ui import mount_ui


@pytest.fixture
def served(tmp_path: Path) -> TestClient:
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<!doctype html><title>fleet-rlm</title>")
    (dist / "assets" / "app.js").write_text("console.log('ui')")
    (tmp_path / "secret.txt").write_text("outside the UI")
    app = FastAPI()
    errors.install(app)

    @app.get("/api/v1/known")
    async def known() -> dict[str, bool]:
        return {"api": True}

    mount_ui(app, dist)
    return TestClient(app)


def test_serves_the_build_and_falls_back_to_index_for_app_routes(served: TestClient) -> None:
    assert "fleet-rlm" in served.get("/").text
    asset = served.get("/assets/app.js")
    assert asset.status_code == 200
    assert asset.text == "console.log('ui')"
    assert "javascript" in asset.headers["content-type"]
    route = served.get("/workspace/abc123")
    assert route.status_code == 200
    assert "fleet-rlm" in route.text
    assert served.get("/api/v1/known").json() == {"api": True}


@pytest.mark.parametrize(
    "path",
    [
        "/..%2fsecret.txt",
        "/assets/..%2f..%2fsecret.txt",
        "/%2e%2e/secret.txt",
        "/assets/%2e%2e/%2e%2e/secret.txt",
    ],
)
def test_a_path_out_of_the_build_never_reads_the_file(served: TestClient, path: str) -> None:
    answer = served.get(path)
    assert "outside the UI" not in answer.text


@pytest.mark.parametrize(
    "path", ["/api/v1/nope", "/api", "/health/x", "/ready/x", "/asyncapi.json/x"]
)
def test_unknown_api_paths_stay_json_404s_not_the_app(served: TestClient, path: str) -> None:
    answer = served.get(path)
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json()["code"] == "not_found"


def test_a_missing_asset_is_404_not_the_index(served: TestClient) -> None:
    # A stale cached page asking for an old bundle must fail loudly, not run index.html as JS.
    assert served.get("/assets/gone.js").status_code == 404
