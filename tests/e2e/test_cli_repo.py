"""`fleet run --repo URL --ref REF` through the whole mesh: `fleet up` with the chat agent
answering from the scripted LM (a FAKE OpenAI-compatible server in this test process). The
repository is a real bare git repository served by a real `git daemon` on loopback (git://,
so the gateway's production rules apply: no local paths); the broker clones it at the ref into
the session sandbox's `repo/`, the RLM's code reads a file there, and the answer tells which
ref was checked out. A second turn naming another ref gets a sandbox with that ref; a turn
naming none keeps the session's checkout. A hostile URL exits 2 and stores nothing.
"""

import base64
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_cli.commands.common import gateway
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually
from fleet_mesh.natsserver import free_port

from .conftest import StartMesh
from .test_cli_context import _ready, fields, fleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def model(request: ScriptedRequest) -> Reply | str:
    """The RLM's step reads the checkout; the other modules are not reached (rlm_only)."""
    if "[[ ## code ## ]]" in request.system:
        code = "SUBMIT(answer=open('repo/plan.txt').read().strip())"
        return fields(reasoning="read the checkout", code=f"```python\n{code}\n```")
    return fields(reasoning="no", answer="not from the checkout")


def _git(*argv: str, cwd: Path) -> None:
    subprocess.run(["git", *argv], cwd=cwd, check=True, capture_output=True, timeout=30)


@pytest.fixture
def served_repo(tmp_path: Path) -> Iterator[str]:
    """`git://127.0.0.1:<port>/plans.git`: tag `v1` holds plan.txt "first plan", `main` holds
    "second plan"."""
    work, base = tmp_path / "work", tmp_path / "served"
    work.mkdir()
    base.mkdir()
    _git("init", "-q", "-b", "main", cwd=work)
    for text in ("first plan", "second plan"):
        (work / "plan.txt").write_text(text + "\n")
        _git("add", "plan.txt", cwd=work)
        _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", text, cwd=work)
        if text == "first plan":
            _git("tag", "v1", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(base / "plans.git"), cwd=tmp_path)
    port = free_port()
    daemon = subprocess.Popen(
        ["git", "daemon", "--export-all", "--reuseaddr", f"--base-path={base}",
         "--listen=127.0.0.1", f"--port={port}", str(base)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"git://127.0.0.1:{port}/plans.git"
    finally:
        daemon.terminate()
        daemon.wait(30)


def _listening(url: str) -> bool:
    port = int(url.split(":")[2].split("/")[0])
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


async def test_run_with_a_repo_reads_the_checkout_at_the_ref(
    start_mesh: StartMesh, served_repo: str
) -> None:
    await eventually(lambda: _listening(served_repo), timeout=30, what="git daemon")
    with ScriptedLM(model) as fake:
        mesh = start_mesh(env={
            "FLEET_AGENT_RUNNER": "chat", "FLEET_LLM_MODEL": "openai/scripted",
            "FLEET_LLM_API_BASE": fake.base_url, "FLEET_LLM_API_KEY": "fake-key",
        })  # fmt: skip
        await eventually(lambda: _ready(mesh), timeout=120, interval=0.25, what="/ready")

        first = fleet(mesh, "run", "What is the plan?", "--repo", served_repo, "--ref", "v1",
                      "--mode", "rlm_only", "--json")  # fmt: skip
        assert first.returncode == 0, (first.stdout, first.stderr, mesh.printed()[-3000:])
        turn = json.loads(first.stdout)
        assert turn["answer"] == "first plan"  # the file at v1, not at main
        requested = turn["events"][0]["data"]
        assert (requested["repo_url"], requested["repo_ref"]) == (served_repo, "v1")
        named = f"[repository {served_repo!r} at 'v1', checked out in the session sandbox"
        assert any(named in r.prompt_text for r in fake.requests)  # the RLM is told the path
        session = turn["session"]

        second = fleet(mesh, "run", "And now?", "--session", session, "--repo", served_repo,
                       "--ref", "main", "--mode", "rlm_only", "--json")  # fmt: skip
        assert second.returncode == 0, (second.stdout, second.stderr)
        assert json.loads(second.stdout)["answer"] == "second plan"  # another ref: re-cloned

        third = fleet(mesh, "run", "Still?", "--session", session, "--mode", "rlm_only",
                      "--json")  # fmt: skip
        assert third.returncode == 0, (third.stdout, third.stderr)
        assert json.loads(third.stdout)["answer"] == "second plan"  # the session's checkout

        exported = fleet(mesh, "sessions", "export", session)
        assert exported.returncode == 0, exported.stderr
        attached = [found for line in exported.stdout.splitlines()
                    for found in _typed(_payload(line), "session.sandbox_attached")]  # fmt: skip
        assert [(a["interpreter"]["repo_url"], a["interpreter"]["ref"], a["reason"])
                for a in attached] == [(served_repo, "v1", "created"),
                                       (served_repo, "main", "repo")]  # fmt: skip
        old, new = (a["interpreter"]["sandbox"] for a in attached)
        async with gateway(mesh.data_dir) as gw:
            replies = [await gw.answer("GET", f"/api/v1/sandboxes/{box}") for box in (old, new)]
        seen = [(r.status_code, r.json().get("status") or r.json().get("code")) for r in replies]
        assert seen == [(404, "sandbox_not_found"), (200, "running")]  # the old one is gone

        before = len(json.loads(fleet(mesh, "sessions", "ls", "--json").stdout))
        for argv in (
            ("--repo", "ext::sh -c id"),
            ("--repo", "file:///etc"),
            ("--repo", served_repo, "--ref", "--upload-pack=x"),
            ("--ref", "v1"),
        ):
            refused = fleet(mesh, "run", "hi", *argv)
            assert refused.returncode == 2, (argv, refused.stderr)
            assert "refused" in refused.stderr or "no repository" in refused.stderr
        after = len(json.loads(fleet(mesh, "sessions", "ls", "--json").stdout))
        assert after == before  # bad input stored nothing

        # well-formed, but nothing is served there: the turn fails saying which repository
        missing = served_repo.replace("plans.git", "missing.git")
        gone = fleet(mesh, "run", "Plan?", "--repo", missing, "--ref", "v1", "--mode", "rlm_only",
                     "--json")  # fmt: skip
        assert gone.returncode == 1, (gone.stdout, gone.stderr)
        failed = json.loads(gone.stdout)
        assert failed["status"] == "failed"
        assert f"repository {missing!r} at 'v1'" in failed["error"], failed["error"]
        ended = failed["events"][-1]
        assert (ended["data"]["type"], ended["data"]["code"]) == ("turn.failed", "repo_unavailable")


def _payload(line: str) -> object:
    """An export line's envelope (its `payload` is the stored JSON, base64)."""
    row = json.loads(line)
    return json.loads(base64.b64decode(row["payload"])) if "payload" in row else row


def _typed(value: object, kind: str) -> list[dict[str, Any]]:
    """Every object of `value` (an export line, parsed) whose `type` is `kind`."""
    if isinstance(value, dict):
        here = [value] if value.get("type") == kind else []
        return here + [f for v in value.values() for f in _typed(v, kind)]
    if isinstance(value, list):
        return [f for v in value for f in _typed(v, kind)]
    return []
