"""`fleet replay SESSION` through the whole mesh: `fleet up` with the chat agent answering from
the scripted LM (a FAKE OpenAI-compatible server in this test process). An RLM turn (two cells
of the root, one `sub_rlm` child with two cells of its own) is recorded by the real mesh; then
`fleet replay <session-id>` finds the gateway and its token from the data dir by itself (and,
from anywhere, from FLEET_URL / FLEET_TOKEN), fetches the export, re-runs every cell in its
own fresh local sandbox with no model call, and says the session reproduces (exit 0). A
session id the tenant does not have (unknown, or another tenant's) is a clear error, exit 2.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_cli.localmesh import mint_token
from fleet_events import new_id
from fleet_harness.scripted_lm import ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually

from .conftest import Mesh, StartMesh
from .test_cli_context import _ready, fields, fleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def step(code: str) -> str:
    return fields(reasoning="next", code=f"```python\n{code}\n```")


def model(request: ScriptedRequest) -> str:
    """The RLM's steps by what the trajectory holds: the root's, then its child's."""
    text = request.prompt_text
    if "[[ ## code ## ]]" not in request.system:
        return fields(reasoning="no", answer="not from the RLM")
    if "REPLAYROOT" in text:
        if "STEP1-OUT" not in text:
            return step("x = 41\nprint('STEP1-OUT', x)")
        if "STEP2-OUT" not in text:
            return step(
                "kid = sub_rlm('REPLAYKID count the letters of kid')\nprint('STEP2-OUT', kid)"
            )
        return step("SUBMIT(answer=str(x + 1) + kid)")
    if "KID-OUT" not in text:
        return step("v = len('kid')\nprint('KID-OUT', v)")
    return step("SUBMIT(answer='K' + str(v))")


def replay(
    session: str, data_dir: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("FLEET_URL", "FLEET_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", "replay", session, "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=180, env=clean | {"COLUMNS": "200"} | (env or {}),
    )  # fmt: skip


async def test_replay_of_a_session_id_fetches_it_through_the_gateway_and_reproduces(
    start_mesh: StartMesh, tmp_path: Path
) -> None:
    with ScriptedLM(model) as fake:
        mesh: Mesh = start_mesh(env={
            "FLEET_AGENT_RUNNER": "chat", "FLEET_LLM_MODEL": "openai/scripted",
            "FLEET_LLM_API_BASE": fake.base_url, "FLEET_LLM_API_KEY": "fake-key",
        })  # fmt: skip
        await eventually(lambda: _ready(mesh), timeout=120, interval=0.25, what="/ready")
        asked = fleet(mesh, "run", "REPLAYROOT: ask a child", "--mode", "rlm_only", "--json")
        assert asked.returncode == 0, asked.stderr
        turn = json.loads(asked.stdout)
        assert (turn["status"], turn["answer"]) == ("completed", "42K3"), turn
        session = turn["session"]
        calls_made = len(fake.requests)

        found = replay(session, mesh.data_dir)  # the URL and token from the data dir
        assert found.returncode == 0, (found.stdout, found.stderr)
        lines = found.stdout.splitlines()
        assert lines[-1].startswith("reproduced: "), found.stdout
        assert " in 2 runs" in lines[-1], found.stdout  # the root and its child
        depths = [len(line) - len(line.lstrip()) for line in lines[:-1]]
        assert depths.count(0) >= 3, found.stdout  # the root's cells (with dspy's set-up cell)
        assert depths.count(2) >= 2, found.stdout  # the child's two cells, one level down
        assert all(line.split()[0] == "reproduced" for line in lines[:-1]), found.stdout
        assert len(fake.requests) == calls_made  # the replay called no model

        token = mint_token(mesh.data_dir)
        elsewhere = tmp_path / "no-mesh-here"
        by_env = replay(session, elsewhere, {"FLEET_URL": mesh.gateway, "FLEET_TOKEN": token})
        assert by_env.returncode == 0, (by_env.stdout, by_env.stderr)
        assert by_env.stdout.splitlines()[-1] == lines[-1]

        unknown = new_id()
        missing = replay(unknown, mesh.data_dir)
        assert missing.returncode == 2, (missing.stdout, missing.stderr)
        assert missing.stdout == ""
        assert unknown in missing.stderr
        assert "session_not_found" in missing.stderr, missing.stderr

        theirs = mint_token(mesh.data_dir, tenant="other-tenant", user="eve")
        foreign = replay(session, elsewhere, {"FLEET_URL": mesh.gateway, "FLEET_TOKEN": theirs})
        assert foreign.returncode == 2, (foreign.stdout, foreign.stderr)
        assert "session_not_found" in foreign.stderr, foreign.stderr  # another tenant's: 404

        not_an_id = replay("no such/file", mesh.data_dir)
        assert not_an_id.returncode == 2, (not_an_id.stdout, not_an_id.stderr)
        assert "neither a file nor a session id" in not_an_id.stderr
