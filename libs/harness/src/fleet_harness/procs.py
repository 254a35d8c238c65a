"""Real service processes for tests: N replicas, SIGKILL and restart, captured logs."""

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


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
        package = "fleet_" + service.replace("-", "_")
        started = []
        for _ in range(count):
            index = sum(1 for r in self.replicas if r.service == service)
            full_env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "NATS_URL": self.nats_url,
                "FLEET_REPLICA": f"{service}-{index}",
                "PYTHONUNBUFFERED": "1",
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
