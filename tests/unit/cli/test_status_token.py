"""Which token `fleet status` and `fleet up` send to `/ready` (an anonymous caller gets only the
verdict; the detail needs an admin's token)."""

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
import pytest
from typer.testing import CliRunner

from fleet_cli import localmesh
from fleet_cli.localmesh import admin_token
from fleet_cli.main import cli
from fleet_cli.mesh import gateway_dir
from fleet_mesh.tokens import signing_secret


@pytest.fixture(autouse=True)
def _own_gateway_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_GATEWAY_DATA_DIR", raising=False)


def test_an_explicit_token_wins_even_for_another_mesh(tmp_path: Path) -> None:
    env = {"FLEET_TOKEN": "given"}
    assert admin_token(tmp_path, env=env) == "given"
    assert admin_token(tmp_path, local=False, env=env) == "given"


def test_no_local_mesh_means_no_token(tmp_path: Path) -> None:
    assert admin_token(tmp_path, env={}) is None


def test_the_local_meshs_development_token_is_an_admins(tmp_path: Path) -> None:
    secret = signing_secret(gateway_dir(tmp_path))
    token = admin_token(tmp_path, env={})
    assert token is not None
    claims = jwt.decode(token, secret, algorithms=["HS256"], options={"verify_aud": False})
    assert claims["fleet_admin"] is True


def test_the_local_token_is_never_sent_to_another_gateway(tmp_path: Path) -> None:
    signing_secret(gateway_dir(tmp_path))
    assert admin_token(tmp_path, local=False, env={}) is None


@pytest.fixture
def gateway() -> Iterator[tuple[str, list[str | None]]]:
    """Something answering `/ready` on this machine, noting each request's Authorization."""
    seen: list[str | None] = []

    class Ready(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = json.dumps({"ready": True, "components": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _status(data_dir: Path) -> None:
    result = CliRunner().invoke(cli(), ["status", "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output


def test_with_no_mesh_running_nothing_is_asked_and_the_last_mesh_is_named(
    tmp_path: Path, gateway: tuple[str, list[str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mesh ran here, at the stand-in's port, and stopped (no up.json; its signing secret
    and the user's reminder remain). Whatever answers at that remembered port now is not this
    mesh: it is asked nothing (so sent no 30-day admin token), and the CLI says no mesh runs,
    where the last one was, and what to do."""
    url, seen = gateway
    monkeypatch.delenv("FLEET_TOKEN", raising=False)
    monkeypatch.delenv("FLEET_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    signing_secret(gateway_dir(tmp_path))
    localmesh.remember_mesh(tmp_path, url)
    result = CliRunner().invoke(cli(), ["status", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"no mesh runs from {tmp_path}" in said
    assert f"gateway {url}, data {tmp_path}, stopped" in said
    assert seen == []
    run = CliRunner().invoke(cli(), ["run", "hello", "--data-dir", str(tmp_path)])
    assert run.exit_code == 2, run.output
    assert "no mesh runs from" in " ".join(run.output.split())
    assert seen == []


def test_a_command_typed_in_another_folder_finds_the_running_mesh(
    tmp_path: Path,
    gateway: tuple[str, list[str | None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`fleet status` with no --data-dir, from a folder with no .fleet: the last mesh this user
    started still runs, so its gateway is asked, with its own development token."""
    url, seen = gateway
    mesh = tmp_path / "mesh"
    secret = signing_secret(gateway_dir(mesh))
    (mesh / "up.json").write_text(json.dumps({"gateway": url, "pid": os.getpid()}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("FLEET_TOKEN", raising=False)
    monkeypatch.delenv("FLEET_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    localmesh.remember_mesh(mesh, url)
    result = CliRunner().invoke(cli(), ["status"])
    assert result.exit_code == 0, result.output
    [sent] = seen
    assert sent is not None
    claims = jwt.decode(sent[7:], secret, algorithms=["HS256"], options={"verify_aud": False})
    assert claims["fleet_admin"] is True


def test_the_running_meshs_gateway_gets_its_token(
    tmp_path: Path, gateway: tuple[str, list[str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = gateway
    monkeypatch.delenv("FLEET_TOKEN", raising=False)
    secret = signing_secret(gateway_dir(tmp_path))
    (tmp_path / "up.json").write_text(json.dumps({"gateway": url}))
    _status(tmp_path)
    [sent] = seen
    assert sent is not None
    assert sent.startswith("Bearer ")
    claims = jwt.decode(sent[7:], secret, algorithms=["HS256"], options={"verify_aud": False})
    assert claims["fleet_admin"] is True
