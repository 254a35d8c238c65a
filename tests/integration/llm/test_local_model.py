"""The real local model: installed by the project's own code (on a fresh machine this downloads
the weights and builds the server, minutes; then it is cached per machine), served, asked.

They assert the mechanics — it answers, it counts tokens, it enforces its key, `fleet up` starts
it and points the default profile at it — never the wisdom of the answer.
"""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleet_cli.localllm import server
from fleet_cli.localllm.install import Installed, ensure_installed
from fleet_cli.localllm.paths import Cache, default_cache
from fleet_cli.localllm.profile import LOCAL_KEY_REF, LOCAL_MODEL
from fleet_cli.mesh import connect_recorded
from fleet_cli.supervisor import Supervisor
from fleet_events.llm import DEFAULT_PROFILE
from fleet_harness.waits import eventually
from fleet_mesh.natsserver import free_port
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader, load_private_key

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a fresh machine builds (~5 min)


@pytest.fixture(scope="module")
def installed() -> Installed:
    return ensure_installed(Cache(default_cache()), lambda line: print(line, flush=True))


@pytest.fixture
def served(installed: Installed, tmp_path: Path) -> Iterator[tuple[server.ServerConfig, str]]:
    key = server.ensure_key(tmp_path / "llm")
    config = server.ServerConfig(model=installed.model, port=free_port(), python=installed.python)
    supervisor = Supervisor(grace_s=5)
    supervisor.launch(server.child_spec(config, key, tmp_path / "llm.log"))
    yield config, key
    supervisor.stop()


async def chat(config: server.ServerConfig, key: str | None, prompt: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {
        "model": server.MODEL_ALIAS,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 16,
        "temperature": 0,
        "seed": 7,
    }
    async with httpx.AsyncClient(timeout=300) as client:
        return await client.post(f"{config.api_base}/chat/completions", json=body, headers=headers)


async def answering(config: server.ServerConfig, key: str) -> None:
    async def probe() -> bool:
        async with httpx.AsyncClient(timeout=2) as client:
            try:
                reply = await client.get(
                    f"{config.api_base}/models", headers={"Authorization": f"Bearer {key}"}
                )
            except httpx.HTTPError:
                return False
        return reply.status_code == 200

    await eventually(probe, timeout=180, interval=0.2, what="the local model server to answer")


async def test_the_installed_model_is_the_upstream_file(installed: Installed) -> None:
    assert installed.model.stat().st_size == 491_400_064
    # installed again: everything is found, nothing is downloaded or built
    again = ensure_installed(Cache(default_cache()), lambda line: None)
    assert again.model == installed.model


async def test_the_server_answers_a_chat_completion_and_enforces_its_key(
    served: tuple[server.ServerConfig, str], tmp_path: Path
) -> None:
    config, key = served
    await answering(config, key)
    reply = await chat(config, key, "Reply with one word: hello")
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["choices"][0]["message"]["content"].strip()
    assert answer["usage"]["prompt_tokens"] > 0
    assert 0 < answer["usage"]["completion_tokens"] <= 16
    # deterministic at temperature 0 with a seed: the same answer again
    again = await chat(config, key, "Reply with one word: hello")
    assert again.json()["choices"] == answer["choices"]
    assert (await chat(config, None, "hi")).status_code == 401
    assert (await chat(config, "not-the-key", "hi")).status_code == 401
    assert key not in (tmp_path / "llm.log").read_text(errors="replace")


EVAL_RUNS = re.compile(r"llama_perf_context_print:\s+eval time =\s+[\d.]+ ms /\s+(\d+) runs")


def eval_runs(log: Path, after: int) -> list[int]:
    """The server's own count of tokens generated, per finished generation, in its log."""
    return [int(n) for n in EVAL_RUNS.findall(log.read_text(errors="replace")[after:])]


async def test_a_request_its_client_abandons_stops_generating_on_the_server(
    served: tuple[server.ServerConfig, str], tmp_path: Path
) -> None:
    """The product closes a call it gives up on (a timeout, a token bound: fleet_agent.lm);
    the embedded server must then stop generating, or the next call waits behind tokens no
    one reads (the issue measured ~8 minutes of that). Its own timings say how far it got."""
    config, key = served
    await answering(config, key)
    log = tmp_path / "llm.log"
    mark = len(await asyncio.to_thread(log.read_text, errors="replace"))
    body = {
        "model": server.MODEL_ALIAS,
        "messages": [{"role": "user", "content": "Count from 1 to 3000, one number per line."}],
        "max_tokens": 1024, "temperature": 0, "seed": 7, "stream": True,
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    pieces = 0
    async with httpx.AsyncClient(timeout=300) as client:
        async with client.stream(
            "POST", f"{config.api_base}/chat/completions", json=body, headers=headers
        ) as streamed:
            assert streamed.status_code == 200
            async for line in streamed.aiter_lines():
                pieces += line.startswith("data: {")
                if pieces >= 20:
                    break  # the client leaves: the response is closed here
        after = await chat(config, key, "Reply with one word: hello")  # served, not queued
    assert after.status_code == 200, after.text

    async def answered_counted() -> list[int] | None:
        found = await asyncio.to_thread(eval_runs, log, mark)
        return found or None

    runs = await eventually(answered_counted, timeout=60, what="the server's timings")
    text = (await asyncio.to_thread(log.read_text, errors="replace"))[mark:]
    assert "Disconnected from client" in text  # the server saw the client leave...
    # ...and stopped: the only generation it timed is the short one (an abandoned one run to
    # its cap would be timed at ~1,000 runs, and the next call would have waited ~40 s)
    assert runs
    assert all(0 < n <= 16 for n in runs), runs


async def test_fleet_up_by_default_serves_the_local_model_behind_the_default_profile(
    installed: Installed, tmp_path: Path
) -> None:
    data_dir = tmp_path / "mesh"
    output = tmp_path / "up.out"
    llm_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_LLM_", "NATS_URL"))}
    env.pop("FLEET_SECRETS_KEY", None)
    env.pop("FLEET_SECRETS_PUBLIC_KEY", None)
    argv = [sys.executable, "-m", "fleet_cli", "up", "--data-dir", str(data_dir)]
    argv += ["--port", str(free_port()), "--nats-port", "0", "--llm-port", str(llm_port)]
    argv += ["--grace", "5"]
    with output.open("wb") as out:
        mesh = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        await eventually(
            lambda: (
                "local model server answering" in output.read_text(errors="replace")
                or mesh.returncode is not None
            ),
            timeout=300,
            what="fleet up to start the local model",
        )
        assert mesh.returncode is None, output.read_text()
        key = (data_dir / "llm" / server.KEY_FILE).read_text().strip()
        config = server.ServerConfig(model=installed.model, port=llm_port, python=sys.executable)
        assert (await chat(config, key, "Reply with one word: hello")).status_code == 200
        state = await eventually(
            lambda: (
                (data_dir / "up.json").exists() and json.loads((data_dir / "up.json").read_text())
            ),
            timeout=60,
            what="up.json",
        )
        nc = await connect_recorded(state, name="test")  # the mesh's own admin
        try:
            js = nc.jetstream()
            stored = await (await LlmConfig.open(js)).find_profile(DEFAULT_PROFILE, tenant=None)
            assert stored.profile.model == LOCAL_MODEL
            assert stored.profile.api_base == config.api_base
            private = load_private_key(data_dir / "secrets" / "services.key")
            reader = await SecretsReader.open_reader(js, private)
            assert await reader.get(LOCAL_KEY_REF) == key
        finally:
            await nc.close()
    finally:
        mesh.send_signal(signal.SIGTERM)
        await asyncio.wait_for(mesh.wait(), 60)
    printed = output.read_text(errors="replace")
    assert "fleet stopped" in printed
    logs = "".join(p.read_text(errors="replace") for p in (data_dir / "logs").glob("*.log"))
    assert "LLM: local" in logs  # the progress lines are logged...
    assert key not in printed
    assert key not in logs  # ...and the key is in none of them
    with pytest.raises(httpx.ConnectError):  # the server went with the mesh
        await chat(config, key, "hi")


async def test_one_command_to_a_real_model_seeds_it_with_its_key_sealed_and_starts_no_local_one(
    tmp_path: Path,
) -> None:
    """The docs' one command: FLEET_LLM_MODEL, _API_BASE and _API_KEY on a fresh data dir. The
    bootstrap seals the key with the key pair `fleet up` made (before, with no FLEET_SECRETS_*
    set, it refused the key and `fleet up` died)."""
    data_dir = tmp_path / "mesh"
    output = tmp_path / "up.out"
    planted = "sk-one-command-" + "5e" * 20
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "NATS_URL"))}
    env |= {
        "FLEET_LLM_MODEL": "openai/big-model",
        "FLEET_LLM_API_BASE": "http://10.9.8.7:8000/v1",
        "FLEET_LLM_API_KEY": planted,
    }
    argv = [sys.executable, "-m", "fleet_cli", "up", "--data-dir", str(data_dir)]
    argv += ["--port", str(free_port()), "--nats-port", "0", "--grace", "5"]
    with output.open("wb") as out:
        mesh = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        state = await eventually(
            lambda: (
                ((data_dir / "up.json").exists() and json.loads((data_dir / "up.json").read_text()))
                or (mesh.returncode is not None and {"exited": mesh.returncode})
            ),
            timeout=120,
            what="fleet up to start its services",
        )
        assert "exited" not in state, output.read_text()
        nc = await connect_recorded(state, name="test")  # the mesh's own admin
        try:
            js = nc.jetstream()
            stored = await (await LlmConfig.open(js)).find_profile(DEFAULT_PROFILE, tenant=None)
            assert stored.profile.model == "openai/big-model"
            private = load_private_key(data_dir / "secrets" / "services.key")
            reader = await SecretsReader.open_reader(js, private)
            assert await reader.get(stored.profile.secret or "", tenant=None) == planted
        finally:
            await nc.close()
    finally:
        mesh.send_signal(signal.SIGTERM)
        await asyncio.wait_for(mesh.wait(), 60)
    printed = output.read_text(errors="replace")
    assert "FLEET_LLM_MODEL is set; the local model is not started" in printed
    assert not (data_dir / "logs" / "llm.log").exists()
    logs = "".join(p.read_text(errors="replace") for p in (data_dir / "logs").glob("*.log"))
    assert planted not in printed + logs
