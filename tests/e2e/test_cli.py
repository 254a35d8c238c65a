"""The `fleet` client commands against a real `fleet up` (the agent's echo runner answers
turns), run as processes: what a person or a script at a terminal sees, stdout and stderr
apart, and the exit status."""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_harness.waits import eventually
from fleet_mesh.natsserver import free_port

from .conftest import Mesh, StartMesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def fleet(
    mesh: Mesh, *argv: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`fleet ARGV` finding the mesh by its data dir only (no FLEET_URL, no FLEET_TOKEN)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("FLEET_URL", "FLEET_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", *argv, "--data-dir", str(mesh.data_dir)],
        input=stdin.decode(), capture_output=True, text=True, timeout=60,
        env=clean | (env or {}) | {"COLUMNS": "200"},
    )  # fmt: skip


async def test_run_answers_on_stdout_with_progress_on_stderr_and_sessions_export_verify(
    start_mesh: StartMesh, tmp_path: Path
) -> None:
    mesh = start_mesh()
    await eventually(lambda: _ready(mesh), timeout=120, interval=0.25, what="/ready")

    asked = fleet(mesh, "run", "hello from the cli")
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout == "hello from the cli\n"  # the answer alone
    assert "turn.started" in asked.stderr
    assert "turn.completed" in asked.stderr
    assert "hello from the cli" not in asked.stderr.replace("· ", "")  # no answer leaked there

    as_json = fleet(mesh, "run", "second", "--json", "--mode", "tools_only")
    assert as_json.returncode == 0, as_json.stderr
    turn = json.loads(as_json.stdout)
    assert (turn["status"], turn["answer"]) == ("completed", "second")
    kinds = [event["data"]["type"] for event in turn["events"]]
    assert kinds[0] == "turn.requested"
    assert kinds[-1] == "turn.completed"
    session = turn["session"]

    listed = fleet(mesh, "sessions", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert session in [item["id"] for item in json.loads(listed.stdout)]
    shown = fleet(mesh, "sessions", "show", session)
    assert [t["user_message"] for t in json.loads(shown.stdout)["turns"]] == ["second"]

    export = tmp_path / "s.ndjson"
    exported = fleet(mesh, "sessions", "export", session, "-o", str(export))
    assert exported.returncode == 0, exported.stderr
    clean = fleet(mesh, "audit", "verify", str(export))
    assert clean.returncode == 0, clean.stderr
    assert "verified" in clean.stderr
    piped = fleet(mesh, "audit", "verify", "-", stdin=export.read_bytes())
    assert piped.returncode == 0, piped.stderr
    by_id = fleet(mesh, "audit", "verify", session)
    assert by_id.returncode == 0, by_id.stderr

    # an edited answer: the line's payload changed, its hash left as it was
    lines = export.read_bytes().splitlines()
    target = next(i for i, line in enumerate(lines) if b"turn.completed" in _payload(line))
    edited = json.loads(lines[target])
    edited["payload"] = _b64(_payload(lines[target]).replace(b'"second"', b'"forged"'))
    lines[target] = json.dumps(edited).encode()
    tampered = fleet(mesh, "audit", "verify", "-", stdin=b"\n".join(lines) + b"\n")
    assert tampered.returncode == 1
    assert edited["id"] in " ".join(tampered.stderr.split())

    imported = fleet(mesh, "sessions", "import", str(export))
    assert imported.returncode == 0, imported.stderr
    copy = imported.stdout.strip()
    assert copy != session
    bad_import = fleet(mesh, "sessions", "import", "-", stdin=b"\n".join(lines) + b"\n")
    assert bad_import.returncode == 2
    assert "export_invalid" in bad_import.stderr

    restored = fleet(mesh, "sessions", "restore", copy, "--reason", "from the cli")
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["seq"] > 0

    removed = fleet(mesh, "sessions", "rm", copy)
    assert removed.returncode == 0, removed.stderr
    after = json.loads(fleet(mesh, "sessions", "ls", "--json").stdout)
    assert copy not in [item["id"] for item in after]
    refused = fleet(mesh, "run", "again", "--session", copy)
    assert refused.returncode == 3, (refused.stdout, refused.stderr)
    assert refused.stdout == ""

    llm = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: `--llm none` started none
    doctor = fleet(mesh, "doctor", env={"FLEET_LLM_API_BASE": llm})
    assert doctor.returncode == 1  # the LLM is down, and only it
    rows = {line.split("│")[1].strip(): line for line in doctor.stdout.splitlines() if "│" in line}
    for name in ("gateway", "token", "nats", "agent", "gateway", "sandbox-broker"):
        assert " up " in rows[name], doctor.stdout
    assert " down " in rows["llm"]
    assert " up " in rows["daytona"]  # not in use: named, not a fault
    assert "not configured" in rows["daytona"]
    assert "FLEET_LLM_API_BASE" in " ".join(doctor.stdout.split())


def _ready(mesh: Mesh) -> bool:
    assert mesh.process.poll() is None, mesh.printed()[-3000:]
    try:
        return mesh.ready().status_code == 200
    except OSError:
        return False


def _payload(line: bytes) -> bytes:
    row = json.loads(line)
    return base64.b64decode(row["payload"]) if "payload" in row else b""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
