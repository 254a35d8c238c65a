"""Real service processes for tests: N replicas, SIGKILL and restart, captured logs."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from nats.errors import NoRespondersError

from fleet_events import bus
from fleet_events.addresses import ALLOW_ENV
from fleet_events.bus import Ping, Pong
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.credentials import env_for


@dataclass
class Replica:
    service: str
    index: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> "Replica":
        self._close_log()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop() / kill()
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the replica's whole process group (sandboxes it started included)."""
        if self.alive():
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL whatever is left of the process group (children a
        clean exit left behind included)."""
        if self.process is None:
            return None
        if self.alive():
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        self._close_log()
        return self.process.returncode

    def restart(self) -> "Replica":
        self.stop()
        return self.start()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Launcher:
    """Starts services as `python -m <package>` against one NATS URL."""

    nats_url: str
    log_dir: Path
    replicas: list[Replica] = field(default_factory=list)

    def start(
        self, service: str, count: int = 1, env: dict[str, str] | None = None
    ) -> list[Replica]:
        package = package_of(service, env or {})
        started = []
        for _ in range(count):
            index = sum(1 for r in self.replicas if r.service == service)
            full_env = {
                **base_env(self.nats_url, f"{service}-{index}", service),
                **(env or {}),
            }
            replica = Replica(
                service=service,
                index=index,
                argv=[sys.executable, "-m", package],
                env=full_env,
                log_path=self.log_dir / f"{service}-{index}.log",
            ).start()
            self.replicas.append(replica)
            started.append(replica)
        return started

    def stop_all(self) -> None:
        for replica in reversed(self.replicas):
            replica.stop()


AGENT_WITH_FAKES = "fleet_harness.agent_fakes"
"""The agent composed with the test fakes its environment asks for (the agent has none)."""


def package_of(service: str, env: dict[str, str]) -> str:
    """The package a replica of `service` runs as: `fleet_<service>`, or the agent composed
    with the test fakes its environment asks for (a scripted runner, an ack barrier)."""
    fakes = env.get("FLEET_AGENT_RUNNER") == "scripted" or env.get(
        "FLEET_AGENT_HOLD_BEFORE_ACK", ""
    ).lower() in ("1", "true", "yes", "on")
    return (
        AGENT_WITH_FAKES if service == "agent" and fakes else "fleet_" + service.replace("-", "_")
    )


def base_env(nats_url: str, replica: str, role: str) -> dict[str, str]:
    """What a service process gets from the harness: nothing of the test's own environment
    beyond PATH and the deployment's egress allow-list (the suite's model servers, fakes all,
    listen on loopback only: conftest.py allows it, a test of the policy clears it), and its
    `role`'s NATS credentials where the suite's servers require them (conftest.py)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "NATS_URL": nats_url,
        "FLEET_REPLICA": replica,
        "PYTHONUNBUFFERED": "1",
    }
    if ALLOW_ENV in os.environ:
        env[ALLOW_ENV] = os.environ[ALLOW_ENV]
    return env | env_for(role)


def start_answering(
    service: str, nats_url: str, log_path: Path, env: dict[str, str], *, timeout: float = 30.0
) -> Replica:
    """Bootstrap the server, start one replica of `service` (its `env` over a minimal base)
    and return once it answers ping: for module-scoped fixtures that share one replica."""
    asyncio.run(_bootstrap(nats_url))
    replica = Replica(
        service=service,
        index=0,
        argv=[sys.executable, "-m", package_of(service, env)],
        env={
            **base_env(nats_url, f"{service}-{uuid.uuid4().hex[:8]}", service),
            **env,
        },
        log_path=log_path,
    ).start()
    asyncio.run(_answering(nats_url, service, timeout))
    return replica


async def _bootstrap(nats_url: str) -> None:
    nc = await connect(nats_url, name="harness-bootstrap")
    try:
        await bootstrap(nc.jetstream())
    finally:
        await nc.close()


async def _answering(nats_url: str, service: str, timeout: float) -> None:
    nc = await connect(nats_url, name="harness-ping")

    async def pong() -> Pong | None:
        try:
            return await rpc.call_verb(nc, bus.ping(service), Ping(), timeout=0.5)
        except (TimeoutError, rpc.RemoteError, NoRespondersError):
            return None

    try:
        await eventually(pong, timeout=timeout, what=f"{service} to answer ping")
    finally:
        await nc.close()
