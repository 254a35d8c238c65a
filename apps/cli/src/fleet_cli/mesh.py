"""`fleet up` as a function: NATS (or $NATS_URL), the bootstrap, the five services, all under
one `Supervisor`, until a stop is asked; then nothing is left running."""

import asyncio
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client
from nats.js.errors import BadRequestError

from fleet_cli import cluster
from fleet_cli.children import ChildSpec, ChildView
from fleet_cli.identity import BadReplicas, replica_name
from fleet_cli.keys import CHECKPOINTER, checkpointing, ensure_keys, signing_env
from fleet_cli.supervisor import Supervisor
from fleet_events.access import ADMIN
from fleet_events.subjects import SERVICES
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect, using_credentials
from fleet_mesh.credentials import (
    CREDENTIALS_DIR_ENV,
    CREDENTIALS_ENV,
    Credentials,
    ensure_credentials,
)
from fleet_mesh.elections import through_election
from fleet_mesh.natsserver import NatsServer, nats_server_binary
from fleet_mesh.tls import CA_ENV, TlsFiles, ensure_tls

STATE_FILE = "up.json"
CREDENTIALS_DIR = "credentials"
TLS_DIR = "tls"
AGENT_RUNNER = "chat"

# Local is one node with no replica to recover from, and a laptop loses power more often than
# a server does: fsync every write ("always"). Local rates are far below its measured cost
# (about 2k acked appends/s). See docs/operations.md.
LOCAL_SYNC_INTERVAL = "always"

log = logging.getLogger("fleet.up")

# Runs after the bootstrap, before the services start: it may launch children of its own (the
# local LLM server) and returns environment the services get on top of `fleet up`'s own.
BeforeServices = Callable[[str, Supervisor], Awaitable[dict[str, str]]]


@dataclass(frozen=True)
class UpOptions:
    data_dir: Path
    gateway_port: int = 8080
    nats_port: int = 4222
    join_url: str | None = None  # NATS_URL: join that server instead of starting one
    grace_s: float = 10.0
    cluster_ports: tuple[int, ...] = ()
    """`--cluster N`: 3N ports (`fleet_cli.cluster.layout`); empty: one node on `nats_port`."""

    @property
    def cluster_size(self) -> int:
        return len(self.cluster_ports) // cluster.PORTS_PER_NODE or 1

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"


class CannotStart(Exception):
    """`fleet up` refuses before starting anything; the message says what to do."""


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def preflight(options: UpOptions) -> None:
    """Refuse what would only fail later, less clearly: a second mesh on one data dir, a port
    someone else holds (the gateway would crash-loop on it)."""
    state = options.data_dir / STATE_FILE
    if state.exists():
        try:
            pid = int(json.loads(state.read_text())["pid"])
            os.kill(pid, 0)
        except (ValueError, KeyError, ProcessLookupError, PermissionError):
            pass  # left by a mesh that did not stop cleanly: nothing runs there now
        else:
            raise CannotStart(
                f"a mesh from {options.data_dir} is already running (fleet up, pid {pid}); "
                "stop it, or pass another --data-dir"
            )
    try:  # an unreadable replicas.json is found before anything starts
        for service in NAMED_REPLICAS:
            replica_name(options.data_dir, service)
    except BadReplicas as exc:
        raise CannotStart(str(exc)) from exc
    ports = [("gateway", "--port", options.gateway_port)]
    if options.join_url is None and options.cluster_ports:
        ports += [("a cluster node's", "--nats-port", p) for p in options.cluster_ports]
    elif options.join_url is None:
        ports.append(("NATS", "--nats-port", options.nats_port))
    for what, flag, port in ports:
        if _port_taken(port):
            raise CannotStart(
                f"{what} port {port} on 127.0.0.1 is in use; pass {flag} with a free port"
                + (" (0 picks one)" if flag == "--nats-port" else "")
            )


def module_of(service: str) -> str:
    """The module a service runs as: `fleet_<service>`, or the one `FLEET_UP_MODULE_<SERVICE>`
    names (tests run the agent composed with its test fakes, `fleet_harness.agent_fakes`)."""
    name = service.replace("-", "_")
    return os.environ.get(f"FLEET_UP_MODULE_{name.upper()}") or f"fleet_{name}"


def gateway_dir(data_dir: Path) -> Path:
    """Where the gateway keeps its signing secret and read models (an explicit
    FLEET_GATEWAY_DATA_DIR wins)."""
    explicit = os.environ.get("FLEET_GATEWAY_DATA_DIR")
    return Path(explicit) if explicit else (data_dir / "gateway").resolve()


def credentials_of(options: UpOptions) -> Credentials | None:
    """The NATS users of the mesh: the directory of seeds `FLEET_NATS_CREDENTIALS_DIR` names
    (joining `NATS_URL`: the one the cluster's users were made from; the test harness sets it
    for every mesh of the suite), else, for the servers `fleet up` starts, seeds it makes
    under `<data dir>/credentials` (kept across restarts); joining with neither, none (an open
    cluster, or every process on the one `FLEET_NATS_CREDENTIALS`)."""
    directory = os.environ.get(CREDENTIALS_DIR_ENV)
    if directory:
        return ensure_credentials(Path(directory))
    if options.join_url is None:
        return ensure_credentials(options.data_dir / CREDENTIALS_DIR)
    return None


def tls_of(options: UpOptions) -> TlsFiles | None:
    """TLS for the nodes of a cluster `fleet up` starts (client ports and routes), from a CA
    it makes at first start under `<data dir>/tls`. One node is served in the clear: it
    listens on loopback only, where nothing travels between hosts and whoever can watch the
    traffic (root on this machine) can read the seeds anyway; docs/deployment.md gives what
    TLS costs. Joining `NATS_URL`, the operator's `FLEET_NATS_CA` (read by every connection)."""
    if options.join_url is None and options.cluster_ports:
        return ensure_tls(options.data_dir / TLS_DIR)
    return None


def service_specs(
    options: UpOptions,
    nats_url: str,
    credentials: Credentials | None = None,
    tls: TlsFiles | None = None,
) -> list[ChildSpec]:
    env = {key: value for key, value in os.environ.items() if key != "FLEET_REPLICA"}
    env.pop(CREDENTIALS_DIR_ENV, None)  # a service holds its own seed, never the others'
    env.update(
        NATS_URL=nats_url,
        PYTHONUNBUFFERED="1",
        FLEET_GATEWAY_HOST="127.0.0.1",
        FLEET_GATEWAY_PORT=str(options.gateway_port),
    )
    # The local mesh keeps everything under its data dir: sandboxes and volumes included, so
    # removing the data dir removes the mesh (an explicit FLEET_SANDBOX_* setting still wins).
    env.setdefault("FLEET_SANDBOX_ROOT", str((options.data_dir / "sandboxes").resolve()))
    env.setdefault("FLEET_SANDBOX_VOLUMES", str((options.data_dir / "volumes").resolve()))
    env.setdefault("FLEET_GATEWAY_DATA_DIR", str(gateway_dir(options.data_dir)))
    # The chat agent answers turns, on the LLM profile the bootstrap seeds (or the embedded
    # model's); FLEET_AGENT_RUNNER=echo runs the mesh with no model at all.
    env.setdefault("FLEET_AGENT_RUNNER", AGENT_RUNNER)
    ensure_keys(options.data_dir, SERVICES)  # every append signed (docs/audit.md)
    return [
        ChildSpec(
            name=service,
            argv=(sys.executable, "-m", module_of(service)),
            env={
                **_named(options.data_dir, service, env),
                **signing_env(options.data_dir, service),
                **(
                    {CREDENTIALS_ENV: str(credentials.seed_path(service))}
                    if credentials is not None
                    else {}
                ),
                **({CA_ENV: str(tls.ca)} if tls is not None else {}),
            },
            log_path=options.logs / f"{service}.log",
        )
        for service in SERVICES
    ]


# Services whose replica name is part of what the log says they hold: each keeps its name
# across restarts of the mesh (fleet_cli.identity). The others get a fresh one each start.
NAMED_REPLICAS = frozenset({"sandbox-broker"})


def _named(data_dir: Path, service: str, env: dict[str, str]) -> dict[str, str]:
    if service not in NAMED_REPLICAS:
        return env
    return {**env, "FLEET_REPLICA": replica_name(data_dir, service)}


async def run_bootstrap(nats_url: str, replicas: int = 1) -> None:
    nc = await connect(nats_url, name="fleet-up")
    try:  # a cluster's streams may still be electing their first leaders
        report = await through_election(lambda: bootstrap(nc.jetstream(), replicas=replicas))
    except BadRequestError as exc:  # a cluster with a node down cannot place a new stream
        raise CannotStart(
            f"the bootstrap could not make the mesh's streams at {replicas} replicas: "
            f"{exc.description}; every node must be up the first time a stream is made "
            "(`fleet status` names the nodes down)"
        ) from None
    finally:
        await nc.close()
    log.info("bootstrap: created %s", ", ".join(report.created) or "nothing (all present)")


async def start_nats(
    supervisor: Supervisor,
    options: UpOptions,
    credentials: Credentials | None,
    timeout: float = 15.0,
) -> str:
    """nats-server from the wheel as a supervised child (restarted like a service, stopped
    last), with the config `NatsServer` writes: loopback, private store, local sync_interval."""
    server = NatsServer(
        store_dir=options.data_dir / "nats",
        port=options.nats_port,
        sync_interval=LOCAL_SYNC_INTERVAL,
        credentials=credentials,
    )
    server.store_dir.mkdir(parents=True, exist_ok=True)
    conf = server.store_dir / "nats.conf"
    conf.write_text(server.config_text())
    spec = ChildSpec(
        name="nats",
        argv=(nats_server_binary(), "-c", str(conf)),
        env=dict(os.environ),
        log_path=options.logs / "nats.log",
        stop_last=True,
    )
    (child,) = supervisor.launch(spec)
    deadline = time.monotonic() + timeout
    while True:
        if not child.alive():
            raise CannotStart(f"nats-server exited at start; see {spec.log_path}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", options.nats_port)
        except OSError:
            if time.monotonic() > deadline:
                raise CannotStart(
                    f"nats-server did not listen on {options.nats_port} within {timeout}s; "
                    f"see {spec.log_path}"
                ) from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return server.url


def stream_replicas(options: UpOptions) -> int:
    """Every stream, bucket and object store at one replica per node of a cluster `fleet up`
    starts; joining `NATS_URL`, one (several URLs may be one server's failover list, where
    more replicas are refused): an operator makes a cluster's streams first with
    `python -m fleet_mesh.bootstrap --replicas 3`, and a stream that exists keeps its replicas
    (`fleet_mesh.bootstrap`)."""
    return options.cluster_size if options.join_url is None else 1


async def start_cluster(
    supervisor: Supervisor,
    options: UpOptions,
    nodes: list[cluster.Node],
    credentials: Credentials | None,
    tls: TlsFiles | None,
    timeout: float = 30.0,
) -> str:
    """The nodes as supervised children; returns their URLs once a meta leader is elected,
    naming the nodes that did not answer by then (a quorum is enough once the cluster has
    formed: `fleet_cli.cluster`)."""
    cluster.launch(
        supervisor, nodes, options.logs, dict(os.environ), LOCAL_SYNC_INTERVAL, credentials, tls
    )
    try:
        leader, down = await cluster.wait_for_quorum(nodes, timeout)
    except cluster.ClusterDown as exc:
        raise CannotStart(str(exc)) from None
    for node in down:
        log.warning(
            "%s (%s) is not answering: going on with %d of %d nodes (a quorum); see %s",
            node.name, node.url, len(nodes) - len(down), len(nodes),
            options.logs / f"{node.name}.log",
        )  # fmt: skip
    log.info(
        "nats cluster of %d nodes on %s (meta leader %s, stores under %s)",
        len(nodes), cluster.urls(nodes), leader, options.data_dir / "nats",
    )  # fmt: skip
    return cluster.urls(nodes)


async def up(
    options: UpOptions,
    stop: asyncio.Event,
    *,
    on_change: Callable[[list[ChildView]], None] = lambda _: None,
    on_started: Callable[[str], None] = lambda _: None,
    before_services: BeforeServices | None = None,
) -> None:
    """Run the whole local mesh until `stop` is set; leave no process behind."""
    options.logs.mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor(grace_s=options.grace_s, on_change=on_change)
    state_file = options.data_dir / STATE_FILE
    credentials = credentials_of(options)
    tls = tls_of(options)
    admin = credentials.seed_path(ADMIN) if credentials is not None else None
    try:
        with using_credentials(admin, tls.ca if tls is not None else None):
            await _up(options, supervisor, stop, credentials, tls, on_started, before_services)
    finally:
        await asyncio.to_thread(supervisor.stop)
        state_file.unlink(missing_ok=True)


async def _up(
    options: UpOptions,
    supervisor: Supervisor,
    stop: asyncio.Event,
    credentials: Credentials | None,
    tls: TlsFiles | None,
    on_started: Callable[[str], None],
    before_services: BeforeServices | None,
) -> None:
    """`up`'s body, its own connections the admin's (`using_credentials`)."""
    state_file = options.data_dir / STATE_FILE
    nodes: list[cluster.Node] = []
    if options.join_url is None and options.cluster_ports:
        nodes = cluster.layout(options.data_dir, options.cluster_ports)
        nats_url = await start_cluster(supervisor, options, nodes, credentials, tls)
    elif options.join_url is None:
        nats_url = await start_nats(supervisor, options, credentials)
        log.info("nats-server on %s (store %s)", nats_url, options.data_dir / "nats")
    else:
        nats_url = options.join_url
        log.info("joining NATS at %s", nats_url)
    await run_bootstrap(nats_url, replicas=stream_replicas(options))
    checkpointer = credentials.seed_path(CHECKPOINTER) if credentials is not None else None
    async with checkpointing(nats_url, options.data_dir, credentials=checkpointer):
        extra_env = await before_services(nats_url, supervisor) if before_services else {}
        specs = service_specs(options, nats_url, credentials, tls)
        for spec in specs:
            spec.env.update(extra_env)
        supervisor.launch(*specs)
        state: dict[str, object] = {
            "pid": os.getpid(),
            "gateway": options.gateway_url,
            "nats": nats_url,
        }
        if credentials is not None:  # where an operator's tools find the admin's seed (a path)
            state["admin"] = str(credentials.seed_path(ADMIN))
        if tls is not None:
            state["ca"] = str(tls.ca)
        if nodes:  # `fleet status` asks each node's monitor for its account of the cluster
            state["cluster"] = [n.recorded() for n in nodes]
        state_file.write_text(json.dumps(state))
        on_started(nats_url)
        await supervisor.watch(stop)


async def connect_recorded(state: dict[str, object], name: str) -> Client:
    """A connection to the mesh an `up.json` describes, as its admin (over TLS where its
    nodes use it): what an operator's tool, a bench or a test of `fleet up` dials with."""
    admin, ca = state.get("admin"), state.get("ca")
    return await connect(
        str(state["nats"]),
        name=name,
        credentials=Path(str(admin)) if admin else None,
        ca=Path(str(ca)) if ca else None,
    )
