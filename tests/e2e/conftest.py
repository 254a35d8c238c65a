"""`fleet up` as a real process, and /proc readers to prove what it leaves behind."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet_cli.errors import ClientError
from fleet_cli.localmesh import mint_token
from fleet_harness.procs import package_of
from fleet_mesh.natsserver import free_port


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str


def processes() -> dict[int, Proc]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        found[int(entry.name)] = Proc(int(entry.name), int(fields[1]), int(fields[2]), fields[0])
    return found


def descendants(root: int) -> set[int]:
    table = processes()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        children = {p.pid for p in table.values() if p.ppid in frontier} - found
        found |= children
        frontier = children
    return found


def living(pids: set[int], pgids: set[int]) -> list[Proc]:
    """Processes, zombies excepted, that are one of `pids` or belong to one of `pgids`."""
    return [
        p for p in processes().values() if p.state != "Z" and (p.pid in pids or p.pgid in pgids)
    ]


@dataclass
class Mesh:
    process: subprocess.Popen[bytes]
    data_dir: Path
    gateway: str
    output: Path

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.data_dir / "up.json").read_text()))

    def ready(self) -> httpx.Response:
        """`/ready` as the operator asks it: with the development token `fleet up` prints (an
        admin's), since only then does it name replicas, addresses and failures. Before the
        gateway has made the secret that token is signed with there is none to send, and the
        verdict is all a wait for ready reads."""
        try:
            headers = {"Authorization": f"Bearer {mint_token(self.data_dir)}"}
        except (ClientError, RuntimeError):  # no secret yet, or one not fully written
            headers = {}
        return httpx.get(f"{self.gateway}/ready", headers=headers, timeout=5)

    def printed(self) -> str:
        return self.output.read_text(errors="replace")


StartMesh = Callable[..., Mesh]
MARK = "FLEET_E2E_MESH"
RUNNER = "FLEET_AGENT_RUNNER"


@pytest.fixture
def start_mesh(tmp_path: Path) -> Iterator[StartMesh]:
    """Start `fleet up` (own data dir, free ports); on teardown stop it and sweep leftovers."""
    meshes: list[Mesh] = []

    def start(
        env: dict[str, str] | None = None,
        data_dir: Path | None = None,
        runner: str | None = "echo",
        args: tuple[str, ...] = (),
    ) -> Mesh:
        """`data_dir`: start on an earlier mesh's data dir (a restart of the same mesh).
        `runner`: `FLEET_AGENT_RUNNER` (echo: these tests run no model); None leaves it unset,
        so `fleet up`'s own default (the chat agent) runs. `args`: more options of `fleet up`."""
        index = len(meshes)
        port = free_port()
        data_dir = data_dir or tmp_path / f"mesh-{index}"
        output = tmp_path / f"mesh-{index}.out"
        inherited = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", RUNNER)}
        full_env = inherited | ({RUNNER: runner} if runner else {}) | (env or {})
        full_env[MARK] = str(data_dir)  # inherited by every child: the teardown's sweep key
        if package_of("agent", full_env) != "fleet_agent":  # a fake asked for: the agent with it
            full_env["FLEET_UP_MODULE_AGENT"] = package_of("agent", full_env)
        argv = [sys.executable, "-m", "fleet_cli", "up", "--data-dir", str(data_dir)]
        argv += ["--port", str(port), "--nats-port", "0", "--grace", "5"]
        argv += ["--llm", "none"]  # the local model has its own tests (tests/integration/llm)
        argv += list(args)
        with open(output, "wb") as out:
            process = subprocess.Popen(
                argv, env=full_env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        mesh = Mesh(process, data_dir, f"http://127.0.0.1:{port}", output)
        meshes.append(mesh)
        return mesh

    yield start
    for mesh in meshes:
        if mesh.process.poll() is None:
            for pid in descendants(mesh.process.pid):  # a SIGSTOPped one never sees SIGTERM
                os.kill(pid, signal.SIGCONT)
            mesh.process.terminate()
            try:
                mesh.process.wait(30)
            except subprocess.TimeoutExpired:
                mesh.process.kill()
                mesh.process.wait(10)
        for pid in marked(str(mesh.data_dir)):  # whatever outlived it, orphans included
            os.kill(pid, signal.SIGKILL)


def marked(value: str) -> list[int]:
    needle = f"{MARK}={value}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
    return found
