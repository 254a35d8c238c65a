"""The client commands' choices that need no mesh: where the mesh is, which token, and input
refused before any request is made."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import jwt
import pytest
from typer.testing import CliRunner, Result

from fleet_cli.client import Gateway, Target, find_target
from fleet_cli.commands.doctor import component_rows
from fleet_cli.errors import ClientError
from fleet_cli.localmesh import NoMesh
from fleet_cli.main import cli
from fleet_mesh.natsserver import free_port
from fleet_mesh.tokens import SECRET_FILE, dev_token

app = cli()  # every command, as `fleet --help` has them


def said(result: Result) -> str:
    return " ".join(result.output.split())


@pytest.fixture(autouse=True)
def no_outside_target(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEET_URL", "FLEET_TOKEN", "FLEET_GATEWAY_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)


def a_mesh_dir(tmp_path: Path, url: str = "http://127.0.0.1:9999") -> Path:
    (tmp_path / "up.json").write_text(json.dumps({"gateway": url, "nats": "nats://x"}))
    dev_token(tmp_path / "gateway")  # the gateway made its secret on first start
    return tmp_path


def test_the_local_mesh_is_found_from_its_data_dir_with_a_token_its_gateway_accepts(
    tmp_path: Path,
) -> None:
    target = find_target(a_mesh_dir(tmp_path, "http://127.0.0.1:7001"), env={})
    assert target.url == "http://127.0.0.1:7001"
    assert target.ws_url == "ws://127.0.0.1:7001"
    secret = (tmp_path / "gateway" / SECRET_FILE).read_text().strip()
    claims = jwt.decode(target.token, secret.encode(), algorithms=["HS256"], audience="fleet-rlm")
    assert (claims["tid"], claims["fleet_admin"]) == ("dev", True)


def test_fleet_url_and_fleet_token_point_the_client_anywhere_else(tmp_path: Path) -> None:
    env = {"FLEET_URL": "https://mesh.example.test/", "FLEET_TOKEN": "tok"}
    target = find_target(a_mesh_dir(tmp_path), env=env)
    assert (target.url, target.token) == ("https://mesh.example.test", "tok")
    assert target.ws_url == "wss://mesh.example.test"


def test_no_gateway_secret_is_a_clear_error_and_none_is_created(tmp_path: Path) -> None:
    """Minting with a fresh secret would give a token no running gateway accepts (every call
    a puzzling 401): the client says to start the mesh and leaves the data dir alone."""
    (tmp_path / "up.json").write_text(json.dumps({"gateway": "http://127.0.0.1:9", "nats": "x"}))
    with pytest.raises(ClientError, match=r"no gateway signing secret in .*fleet up"):
        find_target(tmp_path, env={})
    assert not (tmp_path / "gateway" / SECRET_FILE).exists()


def test_with_no_mesh_running_no_address_is_guessed(tmp_path: Path) -> None:
    """No up.json and no FLEET_URL: the client names the data dir it looked in and what to do,
    instead of sending requests (with FLEET_TOKEN, a real token) to a default port."""
    with pytest.raises(NoMesh, match=r"no mesh runs from .*FLEET_URL and FLEET_TOKEN"):
        find_target(tmp_path, env={"FLEET_TOKEN": "a-real-token"})


def test_fleet_token_prints_only_the_token_and_refuses_a_tenant_that_is_no_id(
    tmp_path: Path,
) -> None:
    mesh = a_mesh_dir(tmp_path)
    good = CliRunner().invoke(app, ["token", "--tenant", "acme", "--data-dir", str(mesh)])
    assert good.exit_code == 0, good.output
    assert good.stdout.count(".") == 2  # a JWT: header.claims.signature
    assert good.stdout.endswith("\n")
    bad = CliRunner().invoke(app, ["token", "--tenant", "a.b", "--data-dir", str(mesh)])
    assert bad.exit_code == 2
    assert bad.stdout == ""
    assert "invalid tenant id 'a.b'" in said(bad)


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "show", "../../auth/me"],
        ["sessions", "rm", "a/b"],
        ["sessions", "export", "x y"],
    ],
)
def test_a_session_id_that_is_no_id_is_refused_before_any_request(
    tmp_path: Path, argv: list[str]
) -> None:
    """The id would otherwise become part of a URL path (`../` reaches other routes)."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a request would say so
    result = CliRunner().invoke(app, [*argv, "--data-dir", str(a_mesh_dir(tmp_path, url))])
    assert result.exit_code == 2
    assert "invalid session id" in said(result)
    assert "no gateway answered" not in said(result)


def test_run_refuses_an_unknown_mode_and_an_empty_question(tmp_path: Path) -> None:
    mesh = str(a_mesh_dir(tmp_path))
    mode = CliRunner().invoke(app, ["run", "hi", "--mode", "fast", "--data-dir", mesh])
    assert mode.exit_code == 2
    assert "--mode 'fast' is not one of auto, rlm_only, tools_only" in said(mode)
    empty = CliRunner().invoke(app, ["run", "  ", "--data-dir", mesh])
    assert empty.exit_code == 2
    assert "the question is empty" in said(empty)


def test_run_without_a_gateway_names_the_url_and_where_it_came_from(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["run", "hi", "--data-dir", str(a_mesh_dir(tmp_path, url))])
    assert result.exit_code == 2
    assert f"no gateway answered at {url}" in said(result)
    assert "up.json" in said(result)


def test_audit_verify_names_an_unreadable_line_and_a_missing_file(tmp_path: Path) -> None:
    broken = tmp_path / "export.ndjson"
    broken.write_text('{"subject": "fleet.session.t.s.log"}\n')
    result = CliRunner().invoke(app, ["audit", "verify", str(broken)])
    assert result.exit_code == 1
    assert "export line 1 is unreadable" in said(result)
    missing = CliRunner().invoke(app, ["audit", "verify", str(tmp_path / "nope.ndjson")])
    assert missing.exit_code == 2
    assert "is neither a file nor a session id" in said(missing)


def test_doctor_gives_each_down_component_its_own_advice_and_names_daytona() -> None:
    rows = {name: (up, advice) for name, up, _, advice in component_rows([
        {"name": "nats", "kind": "nats", "state": "up"},
        {"name": "agent", "kind": "service", "state": "down", "detail": "no replica running"},
        {"name": "SESSIONS", "kind": "stream", "state": "down", "detail": "missing"},
        {"name": "daytona", "kind": "provider", "state": "degraded", "detail": "401 from the API"},
    ])}  # fmt: skip
    assert rows["nats"] == (True, "")
    assert rows["agent"][0] is False
    assert "logs/agent.log" in rows["agent"][1]
    assert "bootstrap" in rows["SESSIONS"][1]
    assert rows["daytona"][0] is False  # degraded: calls to it fail fast
    assert "DAYTONA_API_KEY" in rows["daytona"][1]
    assert "bootstrap" not in rows["daytona"][1]
    (daytona,) = [r for r in component_rows([{"name": "nats", "state": "up"}]) if r[0] == "daytona"]
    assert daytona[1] is True
    assert daytona[2].startswith("not configured: sandboxes run on the local provider")


def test_the_development_token_is_never_sent_to_another_gateway(tmp_path: Path) -> None:
    """FLEET_URL without FLEET_TOKEN used to get the local mesh's 30-day admin token minted
    and sent to it; and with no mesh running (no up.json), to whatever answers on the default
    port."""
    (tmp_path / "running").mkdir()
    mesh = a_mesh_dir(tmp_path / "running", "http://127.0.0.1:7001")
    with pytest.raises(ClientError, match=r"set FLEET_TOKEN .* never sent to another address"):
        find_target(mesh, env={"FLEET_URL": "https://mesh.example.test"})
    assert find_target(mesh, env={"FLEET_URL": "http://127.0.0.1:7001/"}).token  # its own

    stopped = tmp_path / "stopped"
    dev_token(stopped / "gateway")  # a secret from an earlier run; no fleet up now
    with pytest.raises(ClientError, match=r"no mesh runs from .*stopped"):
        find_target(stopped, env={})


def test_a_state_file_left_by_a_killed_fleet_up_is_not_a_running_mesh(tmp_path: Path) -> None:
    """`fleet up` killed with SIGKILL leaves up.json behind: whatever answers on its port now is
    not that mesh's gateway, and is sent no development token."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    mesh = a_mesh_dir(tmp_path, "http://127.0.0.1:7001")
    state = json.loads((mesh / "up.json").read_text())
    (mesh / "up.json").write_text(json.dumps({**state, "pid": int(ended.stdout)}))
    with pytest.raises(ClientError, match=r"no mesh runs from"):
        find_target(mesh, env={})
    (mesh / "up.json").write_text(json.dumps({**state, "pid": os.getpid()}))  # alive
    assert find_target(mesh, env={}).url == "http://127.0.0.1:7001"


async def test_a_503_saying_when_is_asked_again_for_a_ticket_and_a_get_only() -> None:
    """A cluster electing a stream's leader answers 503 `store_unavailable` with Retry-After
    for a few seconds: the ticket (minting twice costs nothing) and reads wait it out; a
    write that may have landed is not sent again."""
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if len(seen) % 3:  # two 503s, then the answer
            body = {"code": "store_unavailable", "message": "the event store did not answer"}
            return httpx.Response(503, json=body, headers={"Retry-After": "0.1"})
        return httpx.Response(200, json={"ticket": "t", "sessions": []})

    target = Target("http://gateway.test", "token", "a test")
    async with Gateway(target, transport=httpx.MockTransport(answer)) as gateway:
        assert await gateway.ticket() == "t"
        assert len(seen) == 3
        await gateway.json("GET", "/api/v1/sessions")
        assert len(seen) == 6
        with pytest.raises(ClientError, match=r"refused \(503 store_unavailable"):
            await gateway.json("POST", "/api/v1/sessions")
        assert seen[6:] == ["POST /api/v1/sessions"]  # asked once


async def test_a_503_not_saying_the_store_is_briefly_away_is_not_asked_again() -> None:
    seen: list[int] = []
    answers = [
        httpx.Response(503, json={"code": "store_unavailable", "message": "no"}),  # no when
        httpx.Response(503, json={"code": "not_ready", "message": "run the bootstrap"},
                       headers={"Retry-After": "1"}),  # a mesh not set up: not transient
    ]  # fmt: skip

    def answer(_: httpx.Request) -> httpx.Response:
        seen.append(1)
        return answers[len(seen) - 1]

    target = Target("http://gateway.test", "token", "a test")
    async with Gateway(target, transport=httpx.MockTransport(answer)) as gateway:
        with pytest.raises(ClientError, match="store_unavailable"):
            await gateway.json("GET", "/api/v1/sessions")
        with pytest.raises(ClientError, match="not_ready"):
            await gateway.json("GET", "/api/v1/sessions")
    assert len(seen) == 2
