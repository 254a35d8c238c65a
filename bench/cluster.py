"""A three-node JetStream cluster beside one node, in one run (issue 24).

    .venv/bin/python bench/cluster.py [--samples 300] [--kills 10]

Both run here, on loopback, with `sync_interval: always` (what `fleet up` writes):
one nats-server, and three routed nodes (`fleet_cli.cluster`'s layout, every stream at 3
replicas). Printed side by side:

1. Append, one writer: `EventStore.append` to `SESSIONS` (chain, optimistic concurrency,
   dedup id); the one node is the baseline. Report it (no goal: a quorum write costs a round
   trip to a follower and its fsync).
2. Appends/s with 16 writers, three nodes against one.
3. SIGKILL of the node leading `SESSIONS` → the next acknowledged append, over `--kills` rounds
   (a writer appends every 10 ms, each attempt bounded by 0.5 s): p50 and p99 of the gap
   between the kill and that append's acknowledgement; goal p50 <= 2 s. After each round the
   node is restarted and caught up, and every append acknowledged so far is read back: the
   count lost is printed (it must be 0).

4. A turn's wall time, `fleet up --cluster 3` against `fleet up` (the whole mesh as processes,
   the echo runner: no model, so the figure is the mesh's own path: the turn's request
   appended, dispatched, started and completed), `--turns` sequential turns on each, the meshes
   one after the other; goal p50 <= 1.3x.
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from nats.aio.client import Client
from nats.aio.msg import Msg

from fleet_cli import cluster
from fleet_cli.keys import KEYSET_FILE, key_path, keys_dir
from fleet_cli.mesh import connect_recorded
from fleet_events import Actor, Envelope, bus, new_id, streams, utc_now
from fleet_events.bus import Ping
from fleet_events.catalog import type_of_class
from fleet_events.chain import TYPE_HEADER
from fleet_events.session import (
    TurnCompleted,
    TurnFailed,
    TurnRequested,
    log_subject,
    session_filter,
)
from fleet_events.signing import KeySet
from fleet_harness.bench import report, side_by_side, stats
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.keyfiles import read_keyset, read_signer
from fleet_mesh.natsserver import NatsServer, Routes, free_port
from fleet_mesh.store import EMPTY, EventStore, StoredEvent, open_store

ACTOR = Actor(service="bench", replica="b-0")
NODES = 3


def envelope(session: str, message: str = "hello") -> Envelope[TurnRequested]:
    return Envelope(
        id=new_id(), tenant="bench", session=session, actor=ACTOR, ts=utc_now(),
        data=TurnRequested(message=message),
    )  # fmt: skip


def start_cluster(root: Path) -> tuple[list[cluster.Node], list[NatsServer]]:
    nodes = cluster.layout(root, tuple(free_port() for _ in range(3 * NODES)))
    servers = [cluster.server_of(n, nodes, "always") for n in nodes]
    for server in servers:
        server.store_dir.mkdir(parents=True, exist_ok=True)
        server.log_path = server.store_dir / "server.log"
        server.start()
    return nodes, servers


async def leader_of(nc: Client, stream: str, timeout: float = 5.0) -> str | None:
    try:
        info = await nc.jetstream(timeout=timeout).stream_info(stream)
    except Exception:  # an election under way
        return None
    return info.cluster.leader if info.cluster else None


async def new_leader(nc: Client, old: str, since: float) -> float:
    """Seconds from `since` until stream info names a leader other than `old`."""
    while True:
        leader = await leader_of(nc, streams.SESSIONS.name, timeout=0.2)
        if leader is not None and leader != old:
            return time.monotonic() - since
        await asyncio.sleep(0.05)


async def caught_up(nc: Client) -> bool:
    """Every store with a leader and two current followers."""
    js = nc.jetstream()
    for name in [s.name for s in streams.STREAMS]:
        try:
            info = await js.stream_info(name)
        except Exception:
            return False
        if info.cluster is None or info.cluster.leader is None:
            return False
        followers = [r for r in (info.cluster.replicas or []) if r.current and not r.offline]
        if len(followers) != NODES - 1:
            return False
    return True


async def until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} did not happen within {timeout:.0f}s")
        await asyncio.sleep(0.1)


async def appends(one: EventStore, three: EventStore, samples: int) -> None:
    heads = {"one": EMPTY, "three": EMPTY}
    sessions = {k: new_id() for k in heads}

    def writer(name: str, store: EventStore) -> Callable[[], Awaitable[None]]:
        subject = log_subject("bench", sessions[name])

        async def append() -> None:
            event = envelope(sessions[name])
            heads[name] = (await store.append(subject, event, expect=heads[name])).head

        return append

    base, proj = await side_by_side(
        writer("one", one), writer("three", three), samples=samples, warmup=20
    )
    report(
        "append, one writer: three nodes (R3) against one node",
        base, proj, goal="reported (a quorum write: a follower's round trip and fsync)",
        unit="append",
    )  # fmt: skip

    each = max(20, samples // 16)

    async def many(store: EventStore, writers: int = 16) -> float:
        async def one_writer() -> None:
            session, head = new_id(), EMPTY
            subject = log_subject("bench", session)
            for _ in range(each):
                head = (await store.append(subject, envelope(session), expect=head)).head

        start = time.perf_counter()
        await asyncio.gather(*(one_writer() for _ in range(writers)))
        return writers * each / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"one": [], "three": []}
    for _ in range(3):  # interleaved
        rates["one"].append(await many(one))
        rates["three"].append(await many(three))
    a, b = statistics.median(rates["one"]), statistics.median(rates["three"])
    print(
        f"== appends/s, 16 writers (median of 3 interleaved)\n"
        f"   one node {a:,.0f}/s   three nodes {b:,.0f}/s   ratio {b / a:.2f}x   goal: reported",
        flush=True,
    )


async def kills(nodes: list[cluster.Node], servers: list[NatsServer], rounds: int) -> None:
    nc = await connect(cluster.urls(nodes), name="bench-kills")
    store = await open_store(nc.jetstream(), streams.SESSIONS, timeout=0.5)
    acked: list[tuple[str, str]] = []  # (subject, event id) of every acknowledged append
    gaps: list[float] = []
    elections: list[float] = []  # kill -> another node named SESSIONS' leader
    try:
        for round_ in range(rounds):
            await until(lambda: caught_up(nc), 90, "the cluster to be whole")
            leader = await leader_of(nc, streams.SESSIONS.name)
            victim = next(i for i, n in enumerate(nodes) if n.name == leader)
            session = new_id()
            subject = log_subject("bench", session)
            killed_at = time.monotonic()
            servers[victim].kill()
            watcher = asyncio.create_task(new_leader(nc, leader or "", killed_at))
            while True:
                event = envelope(session, f"round {round_}")
                try:
                    await store.append(subject, event)
                except Exception:  # no leader yet (a timeout, no stream answered): again
                    await asyncio.sleep(0.01)
                    continue
                gaps.append(time.monotonic() - killed_at)
                acked.append((subject, event.id))
                break
            elections.append(await watcher)
            servers[victim].start()
        await until(lambda: caught_up(nc), 90, "the cluster to be whole")
        present = 0
        for subject, event_id in acked:
            ids = [e.envelope.id async for e in store.replay(subject)]
            present += event_id in ids
    finally:
        await nc.close()
    s = stats(gaps)
    ordered = sorted(gaps)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(
        f"== SIGKILL of SESSIONS' leader node -> next acknowledged append ({rounds} rounds)\n"
        f"   p50 {s.p50_ms / 1000:.2f} s   p99 {p99:.2f} s   max {ordered[-1]:.2f} s   "
        f"goal: p50 <= 2 s\n"
        f"   of which the election (kill -> a new leader named by stream info): p50 "
        f"{statistics.median(elections):.2f} s, max {max(elections):.2f} s\n"
        f"   acknowledged appends lost after the heals: {len(acked) - present} of {len(acked)}",
        flush=True,
    )


def launch_mesh(root: Path, size: int) -> tuple[subprocess.Popen[bytes], IO[bytes], Path]:
    """`fleet up --cluster size` (echo runner) as a process, its output in a file."""
    data = root / f"mesh-{size}"
    argv = [sys.executable, "-m", "fleet_cli", "up", "--data-dir", str(data), "--llm", "none"]
    argv += ["--port", str(free_port()), "--nats-port", "0", "--grace", "5"]
    argv += ["--cluster", str(size)]
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"} | {"FLEET_AGENT_RUNNER": "echo"}
    log = open(root / f"mesh-{size}.out", "wb")  # noqa: SIM115 - closed by turns_on
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log, data


@asynccontextmanager
async def running_mesh(root: Path, size: int) -> AsyncIterator[tuple[Client, Path, dict[str, Any]]]:
    """`fleet up --cluster size` (echo runner) until the agent answers: a client on its NATS,
    its data dir and what it recorded in `up.json`; stopped on the way out."""
    mesh, log, data = launch_mesh(root, size)
    try:
        state = data / "up.json"

        async def started() -> bool:
            if mesh.poll() is not None:
                raise SystemExit(f"bench: fleet up exited; see {root / f'mesh-{size}.out'}")
            return state.exists()

        await until(started, 120, f"fleet up --cluster {size}")
        recorded = json.loads(state.read_text())
        nc = await connect_recorded(recorded, name=f"bench-mesh-{size}")
        try:
            await until(lambda: agent_answers(nc), 120, "the agent to answer ping")
            yield nc, data, recorded
        finally:
            await nc.close()
    finally:
        mesh.terminate()
        await asyncio.to_thread(mesh.wait, 60)
        log.close()


async def turns_on(root: Path, size: int, count: int) -> list[float]:
    """`count` turns' wall times on a `fleet up --cluster size` (echo runner)."""
    async with running_mesh(root, size) as (nc, _, _):
        store = await open_store(nc.jetstream(), streams.SESSIONS)
        return [await one_turn(nc, store) for _ in range(count)]


async def agent_answers(nc: Client) -> bool:
    try:
        await rpc.call_verb(nc, bus.ping("agent"), Ping(), timeout=0.5)
    except Exception:
        return False
    return True


async def one_turn(nc: Client, store: EventStore) -> float:
    session = new_id()
    subject = log_subject("bench", session)
    done = asyncio.get_running_loop().create_future()

    async def on_event(msg: Msg) -> None:
        if (msg.headers or {}).get(TYPE_HEADER) == type_of_class(TurnCompleted) and not done.done():
            done.set_result(time.perf_counter())

    sub = await nc.subscribe(subject, cb=on_event)
    try:
        event = Envelope(
            id=new_id(), tenant="bench", session=session, turn=new_id(), actor=ACTOR,
            ts=utc_now(), data=TurnRequested(message="hello"),
        )  # fmt: skip
        start = time.perf_counter()
        await store.append(subject, event)
        return float(await asyncio.wait_for(done, 60)) - start
    finally:
        await sub.unsubscribe()


async def turns(count: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-cluster-turns-") as tmp:
        one = await turns_on(Path(tmp), 1, count)
        three = await turns_on(Path(tmp), NODES, count)
    report(
        f"a turn (echo runner), fleet up --cluster 3 against fleet up, {count} turns each",
        stats(one[2:]), stats(three[2:]), goal="p50 <= 1.3x", unit="turn",
    )  # fmt: skip


def pid_of(data: Path, node: str) -> int:
    """The pid of `fleet up`'s node `nats-N` (its config file is on its command line)."""
    conf = str(data / "nats" / f"node-{node.rsplit('-', 1)[1]}" / "nats.conf").encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if conf in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    raise SystemExit(f"bench: no process of {node}")


async def meta_leader_of(monitors: list[str]) -> str | None:
    async with httpx.AsyncClient(timeout=1.0) as client:
        return cluster.meta_leader([await cluster.jsz(client, m) for m in monitors])


@dataclass
class Round:
    acked: int = 0
    ended_once: int = 0
    lost: int = 0
    duplicated: int = 0
    unended: int = 0
    started_twice: int = 0
    unverified: int = 0
    """Sessions whose chain or signatures did not verify against the mesh's key set."""
    unended_sessions: list[str] = field(default_factory=list)


async def chaos_round(
    nc: Client, store: EventStore, data: Path, victim_of: Callable[[], Awaitable[str | None]],
    turns_n: int, keys: KeySet,
) -> Round:  # fmt: skip
    """`turns_n` concurrent turns; once a quarter are acknowledged the victim's node is
    SIGKILLed (`fleet up` restarts it). Then every acknowledged request must be present, every
    turn started once and ended exactly once, no event id stored twice, and every session's
    chain and signatures verify against the mesh's pinned key set."""
    result = Round()
    sessions = [new_id() for _ in range(turns_n)]
    acked: set[str] = set()
    some_acked = asyncio.Event()

    async def ask(session: str) -> None:
        event = Envelope(
            id=new_id(), tenant="chaos", session=session, turn=new_id(), actor=ACTOR,
            ts=utc_now(), data=TurnRequested(message=f"chaos {session[:6]}"),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:  # the same envelope each time: a resend is deduplicated by its id
                await store.append(log_subject("chaos", session), event)
            except Exception:
                await asyncio.sleep(0.05)
                continue
            acked.add(session)
            if len(acked) >= max(1, turns_n // 4):
                some_acked.set()
            return

    asking = [asyncio.create_task(ask(s)) for s in sessions]
    await asyncio.wait_for(some_acked.wait(), 60)
    victim = await victim_of()
    if victim is not None:
        os.kill(pid_of(data, victim), signal.SIGKILL)
    await asyncio.gather(*asking)
    result.acked = len(acked)

    async def settled(session: str) -> list[StoredEvent]:
        deadline = time.monotonic() + 120
        while True:
            try:
                seen = [e async for e in store.replay(log_subject("chaos", session))]
            except Exception:
                seen = []
            ended = [e for e in seen if isinstance(e.envelope.data, TurnCompleted | TurnFailed)]
            if ended or time.monotonic() > deadline:
                return seen
            await asyncio.sleep(0.2)

    for session in sorted(acked):
        seen = await settled(session)
        ids = [e.envelope.id for e in seen]
        kinds = [type(e.envelope.data).__name__ for e in seen]
        result.duplicated += len(ids) - len(set(ids))
        result.lost += "TurnRequested" not in kinds
        ends = sum(k in ("TurnCompleted", "TurnFailed") for k in kinds)
        result.ended_once += ends == 1
        result.unended += ends == 0
        if ends == 0:
            result.unended_sessions.append(session)
        result.started_twice += kinds.count("TurnStarted") > 1
        verification = await store.verify(session_filter("chaos", session), keys=keys)
        if not verification.ok:
            result.unverified += 1
            print(f"   {session}: {verification.fault}", flush=True)
    return result


async def chaos(rounds: int, turns_n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-cluster-chaos-") as tmp:
        async with running_mesh(Path(tmp), NODES) as (nc, data, recorded):
            monitors = [n["monitor"] for n in recorded["cluster"]]
            # the turns are asked as the gateway asks them: signed with its key
            signer = read_signer(key_path(data, "gateway"))
            keys = read_keyset(keys_dir(data) / KEYSET_FILE)
            store = await open_store(nc.jetstream(), streams.SESSIONS, timeout=2.0, signer=signer)
            points: dict[str, Callable[[], Awaitable[str | None]]] = {
                "SESSIONS' leader": lambda: leader_of(nc, streams.SESSIONS.name),
                "the meta leader": lambda: meta_leader_of(monitors),
            }
            for point, victim_of in points.items():
                results = []
                for _ in range(rounds):
                    await until(lambda: caught_up(nc), 120, "the cluster to be whole")
                    results.append(await chaos_round(nc, store, data, victim_of, turns_n, keys))
                # a turn started twice (its work item redelivered as a consumer's leader
                # changed, attempt 2 fencing attempt 1) that ended once is reported, not
                # unclean: the attempts are the design's answer to at-least-once delivery
                clean = sum(
                    r.lost == r.duplicated == r.unended == r.unverified == 0
                    and r.ended_once == r.acked
                    for r in results
                )
                unended = [s for r in results for s in r.unended_sessions]
                if unended:  # keep the mesh's logs to read why (the data dir goes with tmp)
                    kept = Path(tempfile.mkdtemp(prefix="bench-cluster-kept-"))
                    shutil.copytree(data / "logs", kept / "logs")
                    print(f"   never ended: {unended}; logs kept in {kept}", flush=True)
                print(
                    f"== chaos: SIGKILL of {point}'s node under {turns_n} concurrent turns\n"
                    f"   rounds clean {clean} of {rounds}; acknowledged "
                    f"{sum(r.acked for r in results)}, ended exactly once "
                    f"{sum(r.ended_once for r in results)}, never ended "
                    f"{sum(r.unended for r in results)}, lost "
                    f"{sum(r.lost for r in results)}, stored twice "
                    f"{sum(r.duplicated for r in results)}, chain or signature failing "
                    f"{sum(r.unverified for r in results)}; started twice (a second attempt, "
                    f"ended once) {sum(r.started_twice for r in results)}",
                    flush=True,
                )


class CutProxy:
    """A TCP relay in front of one node's route port. Every route connection of the cluster
    passes through one (each node advertises its proxy, so gossip never names a real port),
    and the relay reads who dialed from the route's CONNECT (its server id). `sever` closes
    the connections that involve the isolated node (all of its own proxy's, and the ones it
    dialed) and refuses new ones until `heal`."""

    def __init__(self, target: int, fronts_isolated: bool) -> None:
        self.target, self.fronts_isolated = target, fronts_isolated
        self.isolated_id = ""  # the isolated node's server id, once known
        self.cut = False
        self.port = 0
        self._open: dict[tuple[asyncio.StreamWriter, asyncio.StreamWriter], bytes] = {}
        self._server: asyncio.Server | None = None

    async def start(self) -> "CutProxy":
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, first: bytes) -> None:
            try:
                if first:
                    dst.write(first)
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        back = asyncio.create_task(pipe(up_reader, writer, b""))  # the target's INFO first
        try:
            connect = await asyncio.wait_for(reader.readline(), 10)  # the dialer's CONNECT
        except (TimeoutError, OSError):
            connect = b""
        if self.cut and self._involves(connect):
            writer.close()
            up_writer.close()
            back.cancel()
            return
        pair = (writer, up_writer)
        self._open[pair] = connect
        await asyncio.gather(pipe(reader, up_writer, connect), back)
        self._open.pop(pair, None)

    def _involves(self, connect: bytes) -> bool:
        """Judged when asked (the isolated node's id is learned after the routes form)."""
        named = bool(self.isolated_id) and f'"name":"{self.isolated_id}"'.encode() in connect
        return self.fronts_isolated or named

    def sever(self) -> None:
        self.cut = True
        for (writer, up_writer), hello in list(self._open.items()):
            if self._involves(hello):
                writer.close()
                up_writer.close()

    def heal(self) -> None:
        self.cut = False

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def partitioned_cluster(root: Path) -> tuple[list[NatsServer], list[CutProxy]]:
    """Three nodes whose routes all pass through proxies; the last node can be cut off."""
    clients = [free_port() for _ in range(NODES)]
    routes = [free_port() for _ in range(NODES)]
    monitors = [free_port() for _ in range(NODES)]
    isolated = NODES - 1
    proxies = [await CutProxy(routes[i], i == isolated).start() for i in range(NODES)]
    servers = []
    for i in range(NODES):
        server = NatsServer(
            store_dir=root / f"node-{i}", port=clients[i], server_name=f"nats-{i}",
            sync_interval="always",
            routes=Routes(
                "fleet-bench", routes[i], tuple(p.port for p in proxies), monitors[i],
                advertise_port=proxies[i].port,
            ),
        )  # fmt: skip
        server.store_dir.mkdir(parents=True)
        server.log_path = server.store_dir / "server.log"
        servers.append(server.start())
    async with httpx.AsyncClient(timeout=2.0) as client:
        varz = (await client.get(f"http://127.0.0.1:{monitors[isolated]}/varz")).json()
    for proxy in proxies:
        proxy.isolated_id = str(varz["server_id"])
    monitor_urls = [f"http://127.0.0.1:{m}" for m in monitors]

    async def elected() -> bool:
        return await meta_leader_of(monitor_urls) is not None

    await until(elected, 60, "a meta leader")
    return servers, proxies


async def cut_rounds(rounds: int, per_side: int = 3) -> None:
    """The last node's routes cut while its client port answers: appends sent to it must be
    refused or time out and be absent after the heal; the majority's are acknowledged."""
    with tempfile.TemporaryDirectory(prefix="bench-cluster-cut-") as tmp:
        servers, proxies = await partitioned_cluster(Path(tmp))
        majority_nc = await connect(",".join(s.url for s in servers[:-1]), name="bench-major")
        minority_nc = await connect(servers[-1].url, name="bench-minor")
        tallies = {"refused": 0, "acked_cut": 0, "present_cut": 0, "acked": 0, "present": 0}
        clean = 0
        try:
            js = majority_nc.jetstream()
            await bootstrap(js, replicas=NODES)
            major = await open_store(js, streams.SESSIONS, timeout=2.0)
            minor = await open_store(
                minority_nc.jetstream(timeout=2.0), streams.SESSIONS, timeout=2.0
            )
            for round_ in range(rounds):
                await until(lambda: caught_up(majority_nc), 120, "the cluster to be whole")
                session = new_id()
                subject = log_subject("bench", session)
                for proxy in proxies:
                    proxy.sever()
                sent_cut, acked_cut = [], []
                for i in range(per_side):
                    event = envelope(session, f"round {round_}: to the cut-off node {i}")
                    sent_cut.append(event.id)
                    try:
                        await minor.append(subject, event)
                        acked_cut.append(event.id)
                    except Exception:  # refused or timed out: what a minority must answer
                        tallies["refused"] += 1
                acked = []
                for i in range(per_side):
                    event = envelope(session, f"round {round_}: to the majority {i}")
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        try:  # the same event each time: a resend is deduplicated
                            await major.append(subject, event)
                        except Exception:  # the majority electing a leader: again
                            await asyncio.sleep(0.1)
                            continue
                        acked.append(event.id)
                        break
                for proxy in proxies:
                    proxy.heal()
                await until(lambda: caught_up(majority_nc), 120, "the heal")
                stored = {e.envelope.id async for e in major.replay(subject)}
                present_cut = len(stored & set(sent_cut))
                tallies["acked_cut"] += len(acked_cut)
                tallies["present_cut"] += present_cut
                tallies["acked"] += len(acked)
                tallies["present"] += len(stored & set(acked))
                clean += (
                    not acked_cut and present_cut == 0 and set(acked) <= stored
                    and len(acked) == per_side
                )  # fmt: skip
        finally:
            await majority_nc.close()
            await minority_nc.close()
            for proxy in proxies:
                proxy.close()
            for server in servers:
                server.stop()
    print(
        f"== chaos: the last node's routes cut, its client port reachable ({rounds} rounds)\n"
        f"   rounds clean {clean} of {rounds}; appends sent to the cut-off node "
        f"{rounds * per_side}: refused or timed out {tallies['refused']}, acknowledged "
        f"{tallies['acked_cut']}, present after the heal {tallies['present_cut']}; appends to "
        f"the majority acknowledged {tallies['acked']} of {rounds * per_side}, present "
        f"{tallies['present']}",
        flush=True,
    )


async def main(samples: int, rounds: int, turn_count: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        root = Path(tmp)
        single = NatsServer(store_dir=root / "one", sync_interval="always").start()
        nodes, servers = start_cluster(root / "three")
        try:
            await cluster.wait_for_quorum(nodes, 30)
            one_nc = await connect(single.url, name="bench-one")
            three_nc = await connect(cluster.urls(nodes), name="bench-three")
            await bootstrap(one_nc.jetstream(), replicas=1)
            await bootstrap(three_nc.jetstream(), replicas=NODES)
            await until(lambda: caught_up(three_nc), 60, "three replicas of every stream")
            print(f"load average {os.getloadavg()[0]:.1f}; sync_interval always on every node")
            one = await open_store(one_nc.jetstream(), streams.SESSIONS)
            three = await open_store(three_nc.jetstream(), streams.SESSIONS)
            await appends(one, three, samples)
            await one_nc.close()
            await three_nc.close()
            await kills(nodes, servers, rounds)
        finally:
            single.stop()
            for server in servers:
                server.stop()
    await turns(turn_count)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument(
        "--chaos", type=int, default=0, metavar="ROUNDS",
        help="only the chaos rounds: ROUNDS per kill point, 20 concurrent turns each",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="--samples 60 --kills 2 --turns 8")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.kills, args.turns = 60, 2, 8
    if args.chaos:
        asyncio.run(chaos(args.chaos, 20))
        asyncio.run(cut_rounds(args.chaos))
    else:
        asyncio.run(main(args.samples, args.kills, args.turns))
