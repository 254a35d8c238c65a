"""`fleet up` runs the chat agent by default: `fleet run "hello"` is answered by the model the
FLEET_LLM_* variables point at (the scripted LM, a FAKE OpenAI-compatible server in this
process), and with no model configured (`--llm none`, no FLEET_LLM_*) the turn fails saying
what to configure, instead of an echo that looks like an answer."""

import json
import os
import subprocess
import sys

import httpx
import pytest

from fleet_harness.scripted_lm import ScriptedLM
from fleet_harness.waits import eventually

from .conftest import Mesh, StartMesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LLM_ENV = ("FLEET_LLM_MODEL", "FLEET_LLM_API_BASE", "FLEET_LLM_API_KEY")
KEY = "sk-e2e-chat-not-a-real-key"


def fleet(mesh: Mesh, *argv: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("FLEET_URL", "FLEET_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", *argv, "--data-dir", str(mesh.data_dir)],
        capture_output=True, text=True, timeout=120, env=clean | {"COLUMNS": "200"},
    )  # fmt: skip


def ready(mesh: Mesh) -> bool:
    assert mesh.process.poll() is None, mesh.printed()[-3000:]
    try:
        return mesh.ready().status_code == 200
    except httpx.HTTPError:
        return False


def cot(answer: str) -> str:
    """A ChainOfThought reply in dspy's ChatAdapter format (the chat agent's first module)."""
    return (
        f"[[ ## reasoning ## ]]\nsay hello back\n\n[[ ## answer ## ]]\n{answer}\n\n"
        "[[ ## needs_tools ## ]]\nFalse\n\n[[ ## completed ## ]]\n"
    )


@pytest.fixture(autouse=True)
def no_model_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LLM_ENV:
        monkeypatch.delenv(name, raising=False)


async def test_fleet_run_is_answered_by_the_configured_model(start_mesh: StartMesh) -> None:
    with ScriptedLM([cot("Hello! How can I help?")], api_key=KEY) as fake:
        env = {
            "FLEET_LLM_MODEL": "openai/scripted", "FLEET_LLM_API_BASE": fake.base_url,
            "FLEET_LLM_API_KEY": KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }  # fmt: skip
        mesh = start_mesh(env=env, runner=None)  # fleet up's own default runner
        await eventually(lambda: ready(mesh), timeout=120, interval=0.25, what="/ready")
        asked = fleet(mesh, "run", "hello", "--json")
        assert asked.returncode == 0, (asked.stdout, asked.stderr, mesh.printed()[-2000:])
        turn = json.loads(asked.stdout)
        assert (turn["status"], turn["answer"]) == ("completed", "Hello! How can I help?")
        assert len(fake.requests) == 1
        assert fake.requests[0].authorization == f"Bearer {KEY}"
        assert "hello" in fake.requests[0].last_user
        assert fake.refused_auth == 0
    kinds = [event["data"]["type"] for event in turn["events"]]
    assert kinds[0] == "turn.requested"
    assert kinds[-1] == "turn.completed"
    assert KEY not in asked.stdout + asked.stderr


async def test_with_no_model_the_turn_fails_naming_what_to_configure(
    start_mesh: StartMesh,
) -> None:
    mesh = start_mesh(runner=None)  # --llm none (conftest) and no FLEET_LLM_*
    await eventually(lambda: ready(mesh), timeout=120, interval=0.25, what="/ready")
    asked = fleet(mesh, "run", "hello", "--json")
    assert asked.returncode == 1, (asked.stdout, asked.stderr)
    turn = json.loads(asked.stdout)
    assert turn["status"] == "failed"
    assert "no language model" in turn["error"]
    for what in ("FLEET_LLM_MODEL", "--llm none", "planner", "FLEET_AGENT_RUNNER=echo"):
        assert what in turn["error"], what
    failed = [e["data"] for e in turn["events"] if e["data"]["type"] == "turn.failed"]
    assert [(f["code"], f["retryable"]) for f in failed] == [("llm_not_configured", False)]
