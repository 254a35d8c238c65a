"""`fleet run --context PATH…` through the whole mesh: `fleet up` with the chat agent
(`FLEET_AGENT_RUNNER=chat`) answering from the scripted LM (a FAKE OpenAI-compatible server in
this test process, which sees every prompt). A file becomes a document of the session and its
text reaches the model; a directory becomes the session sandbox's checkout and the RLM's code
reads it there; `--mode` reaches the turn; the exit status says success, refusal, failure or
bad input.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually

from .conftest import Mesh, StartMesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SECRET = "the launch code is ZEBRA-4417"
BROKEN = "please fail this turn"


def fields(**values: object) -> str:
    """A reply in dspy's ChatAdapter format."""
    body = "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items())
    return body + "[[ ## completed ## ]]\n"


def model(request: ScriptedRequest) -> Reply | str:
    """Answers by what the prompt holds: the code if the document's text reached it."""
    prompt, system = request.prompt_text, request.system
    if BROKEN in prompt:
        return Reply("the fake refuses", status=400)  # not retried: the turn fails
    if "[[ ## code ## ]]" in system:  # the RLM's step: read the checkout in the sandbox
        code = "SUBMIT(answer=open('plans/today.txt').read().strip())"
        return fields(reasoning="read the file", code=f"```python\n{code}\n```")
    answer = "ZEBRA-4417" if SECRET in prompt else "no code in sight"
    if "next_tool_name" in system:
        return fields(next_thought="it is in the document", next_tool_name="finish",
                      next_tool_args="{}")  # fmt: skip
    if "needs_tools" in system:
        return fields(reasoning="the document says", answer=answer, needs_tools=False)
    return fields(reasoning="from the trajectory", answer=answer)


def fleet(mesh: Mesh, *argv: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("FLEET_URL", "FLEET_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", *argv, "--data-dir", str(mesh.data_dir)],
        capture_output=True, text=True, timeout=120, env=clean | {"COLUMNS": "200"},
    )  # fmt: skip


async def test_run_with_context_answers_from_a_file_and_a_directory_through_the_mesh(
    start_mesh: StartMesh, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text(f"Minutes of Tuesday.\n{SECRET}.\nNothing else was decided.\n")
    project = tmp_path / "project"
    (project / "plans").mkdir(parents=True)
    (project / "plans" / "today.txt").write_text("ship the checkout reader\n")
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # never sent
    with ScriptedLM(model) as fake:
        mesh = start_mesh(env={
            "FLEET_AGENT_RUNNER": "chat", "FLEET_LLM_MODEL": "openai/scripted",
            "FLEET_LLM_API_BASE": fake.base_url, "FLEET_LLM_API_KEY": "fake-key",
        })  # fmt: skip
        await eventually(lambda: _ready(mesh), timeout=120, interval=0.25, what="/ready")

        asked = fleet(mesh, "run", "What did we decide?", "--context", str(notes))
        assert asked.returncode == 0, asked.stderr
        assert asked.stdout == "ZEBRA-4417\n"  # the answer alone, from the document's text
        assert f"document notes: {notes}" in asked.stderr
        assert "turn.completed" in asked.stderr
        seen = [r for r in fake.requests if SECRET in r.prompt_text]
        assert seen, "the document's text never reached the model"

        as_json = fleet(mesh, "run", "And again?", "--context", str(notes), "--json",
                        "--mode", "tools_only")  # fmt: skip
        assert as_json.returncode == 0, as_json.stderr
        turn = json.loads(as_json.stdout)
        assert (turn["status"], turn["answer"]) == ("completed", "ZEBRA-4417")
        requested = turn["events"][0]["data"]
        assert requested["type"] == "turn.requested"
        assert (requested["mode"], requested["document_ids"]) == ("tools_only", ["notes"])
        assert requested["message"] == "And again?"  # the text travels as a document
        assert as_json.stderr == ""  # --json: no progress lines to mix in

        read = fleet(mesh, "run", "What is today's plan?", "--context", str(project),
                     "--mode", "rlm_only", "--json")  # fmt: skip
        assert read.returncode == 0, read.stderr
        turn = json.loads(read.stdout)
        assert turn["answer"] == "ship the checkout reader"  # read in the session's sandbox
        requested = turn["events"][0]["data"]
        assert (requested["mode"], requested["context_paths"]) == ("rlm_only", ["plans/today.txt"])

        gone = turn["session"]
        assert fleet(mesh, "sessions", "rm", gone).returncode == 0
        refused = fleet(mesh, "run", "one more?", "--session", gone)
        assert refused.returncode == 3, (refused.stdout, refused.stderr)  # a refusal
        assert refused.stdout == ""
        assert "turn refused" in refused.stderr

        failed = fleet(mesh, "run", BROKEN)
        assert failed.returncode == 1, (failed.stdout, failed.stderr)
        assert failed.stdout == ""
        assert "turn failed" in failed.stderr

        before = len(json.loads(fleet(mesh, "sessions", "ls", "--json").stdout))
        missing = fleet(mesh, "run", "hi", "--context", str(tmp_path / "nope.txt"))
        assert missing.returncode == 2
        assert f"--context {tmp_path / 'nope.txt'}: no such file or directory" in missing.stderr
        binary = tmp_path / "blob.bin"
        binary.write_bytes(b"\xff\xfe\x00 not text")
        refused = fleet(mesh, "run", "hi", "--context", str(binary))
        assert refused.returncode == 2
        assert "not UTF-8 text (byte 0)" in refused.stderr
        after = len(json.loads(fleet(mesh, "sessions", "ls", "--json").stdout))
        assert after == before  # bad input stored nothing


def _ready(mesh: Mesh) -> bool:
    assert mesh.process.poll() is None, mesh.printed()[-3000:]
    try:
        return mesh.ready().status_code == 200
    except OSError:
        return False
