"""Budget benchmark: grant round trip vs a raw NATS echo, and grants/s with 1 vs 3 replicas.

Run: `.venv/bin/python bench/budget.py [--quick] [--sync always|2m]`. Starts its own
nats-server (`sync_interval` as given: `always` is the local default, `2m` the cluster's, see
docs/architecture.md "Durability"), bootstraps it, and runs the budget service as real processes.

`--compare-with TREE [--runs N]`: the budget of another checkout (`mkdir /tmp/base && git
archive REV | tar -x -C /tmp/base`; its sources first on the baseline replicas' PYTHONPATH) as
the baseline, this tree's as the project, each on its own nats-server, measured in N rounds
that alternate which side goes first: the grant round trip (1 in flight) and grants/s (64 in
flight on one tree, the group-commit path), reported as the median and spread of the rounds'
project/baseline cost ratios.
"""

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg

from fleet_events import bus as verbs
from fleet_events import new_id
from fleet_events.budget import (
    ATTEMPT_TIMEOUT_S,
    RETRYABLE_CODES,
    Grant,
    GrantReply,
    OpenTree,
)
from fleet_events.bus import Ping
from fleet_harness.bench import (
    report,
    report_rounds,
    report_single,
    side_by_side,
    sides_in_turn,
    sources_of,
    stats,
)
from fleet_harness.procs import Launcher, Replica
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer

BIG = 10_000_000


async def ready(nc: Client, replicas: list[Replica]) -> None:
    wanted = {r.env["FLEET_REPLICA"] for r in replicas}
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while not wanted <= seen:
        if time.monotonic() > deadline:
            raise TimeoutError(f"replicas {sorted(wanted - seen)} never answered ping")
        try:
            pong = await rpc.call_verb(nc, verbs.ping("budget"), Ping(), timeout=0.5)
            if "concurrency" in pong.details:  # set at the end of setup: its subscriptions are live
                seen.add(pong.replica)
        except Exception:  # noqa: S110 - starting up: no responders yet
            pass


async def open_tree(nc: Client, limit: int = BIG) -> str:
    tree = new_id()
    request = OpenTree(request_id=new_id(), tenant="bench", tree=tree, max_llm_calls=limit)
    reply = await rpc.call_verb(nc, verbs.OPEN_TREE, request, timeout=5)
    assert reply.opened
    return tree


RETRIED: list[str] = []


async def grant(nc: Client, tree: str) -> GrantReply:
    """One grant, following the client rule (docs/budget.md): same request id on a retry."""
    request = Grant(request_id=new_id(), tree=tree, run="bench")
    while True:
        try:
            return await rpc.call_verb(nc, verbs.GRANT, request, timeout=ATTEMPT_TIMEOUT_S)
        except rpc.RemoteError as exc:
            if exc.code not in RETRYABLE_CODES:
                raise
            RETRIED.append(exc.code)


async def round_trip(nc: Client, samples: int) -> None:
    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe("bench.echo", cb=echo)
    payload = Grant(request_id=new_id(), tree=new_id(), run="bench")
    body = rpc._encoder.encode(payload)
    tree = await open_tree(nc)

    async def baseline() -> None:
        await nc.request("bench.echo", body, timeout=5)

    async def project() -> None:
        await grant(nc, tree)

    async def append() -> None:  # the durable write a grant must wait for, on its own
        await js.publish(floor_subject, body, stream="BUDGET")

    js = nc.jetstream()
    floor_subject = f"fleet.budget.bench.{new_id()}.floor"
    base, proj = await side_by_side(baseline, project, samples=samples)
    report(
        "grant round trip (1 in flight) vs raw NATS request/reply echo",
        base,
        proj,
        goal="<= 3x",
        unit="grant",
    )
    base, floor = await side_by_side(baseline, append, samples=samples)
    report(
        "for reference: one acked JetStream publish (no service) vs the same echo",
        base,
        floor,
        goal="none: the floor under any durable grant",
        unit="publish",
    )


async def throughput(nc: Client, label: str, trees: list[str], total: int, inflight: int) -> None:
    latencies: list[float] = []
    queue = iter(range(total))

    async def worker() -> None:
        for index in queue:
            start = time.perf_counter()
            reply = await grant(nc, trees[index % len(trees)])
            assert reply.granted
            latencies.append(time.perf_counter() - start)

    RETRIED.clear()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    wall = time.perf_counter() - started
    measured = stats(latencies)
    report_single(
        f"{label}: {total} grants, {inflight} in flight, {len(trees)} tree(s) "
        f"-> {total / wall:,.0f} grants/s ({len(RETRIED)} answered 'unavailable' and resent)",
        measured,
        unit="grant (per client)",
    )


async def main(quick: bool, logs: Path | None, sync: str) -> None:
    samples, total, inflight = (200, 2000, 64) if quick else (1000, 6000, 64)
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        root = Path(tmp)
        server = NatsServer(
            store_dir=root / "store", log_path=root / "nats.log", sync_interval=sync
        ).start()
        launcher = Launcher(nats_url=server.url, log_dir=logs or root)
        nc = await connect(server.url, name="bench")
        try:
            await bootstrap(nc.jetstream())
            first = launcher.start("budget", count=1)
            await ready(nc, first)
            print(f"nats-server sync_interval {sync}")
            await round_trip(nc, samples)
            many = [await open_tree(nc) for _ in range(200)]
            for replicas in (1, 3):
                if replicas == 3:
                    await ready(nc, launcher.start("budget", count=2))
                one = [await open_tree(nc)]
                await throughput(nc, f"{replicas} replica(s), one tree", one, total, inflight)
                await throughput(nc, f"{replicas} replica(s), many trees", many, total, inflight)
        finally:
            await nc.close()
            launcher.stop_all()
            server.stop()


async def compare(other: Path, runs: int, quick: bool, sync: str) -> None:
    """This tree's budget against `other`'s, one nats-server and one replica each."""
    samples, total = (100, 1000) if quick else (300, 3000)
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        root, servers, launchers, conns = Path(tmp), [], [], []
        try:
            for side, env in (("baseline", {"PYTHONPATH": sources_of(other)}), ("project", {})):
                server = NatsServer(
                    store_dir=root / side / "store", log_path=root / f"{side}-nats.log",
                    sync_interval=sync,
                ).start()  # fmt: skip
                servers.append(server)
                launcher = Launcher(nats_url=server.url, log_dir=root / side)
                (root / side).mkdir(exist_ok=True)
                launchers.append(launcher)
                nc = await connect(server.url, name=f"bench-{side}")
                conns.append(nc)
                await bootstrap(nc.jetstream())
                await ready(nc, launcher.start("budget", count=1, env=env))
            trees = [await open_tree(nc) for nc in conns]
            sides = {"baseline": 0, "project": 1}
            trips: dict[str, list[float]] = {"baseline": [], "project": []}
            rates: dict[str, list[float]] = {"baseline": [], "project": []}
            for nc, tree in zip(conns, trees, strict=True):  # warm both up
                for _ in range(50):
                    await grant(nc, tree)
            for _, side in sides_in_turn(runs):
                nc, tree = conns[sides[side]], trees[sides[side]]
                latencies = []
                for _ in range(samples):
                    start = time.perf_counter()
                    await grant(nc, tree)
                    latencies.append(time.perf_counter() - start)
                trips[side].append(stats(latencies).p50_ms)
                rates[side].append(await grants_per_s(nc, tree, total, 64))
            print(f"nats-server sync_interval {sync}; baseline {other}, project this tree")
            report_rounds(
                "grant round trip p50, 1 in flight", trips["baseline"], trips["project"],
                unit="ms", higher_is_better=False,
            )  # fmt: skip
            report_rounds(
                f"grants/s, {total} grants, 64 in flight on one tree (group commits)",
                rates["baseline"], rates["project"], unit="grants/s", higher_is_better=True,
            )  # fmt: skip
        finally:
            for nc in conns:
                await nc.close()
            for launcher in launchers:
                launcher.stop_all()
            for server in servers:
                server.stop()


async def grants_per_s(nc: Client, tree: str, total: int, inflight: int) -> float:
    queue = iter(range(total))

    async def worker() -> None:
        for _ in queue:
            assert (await grant(nc, tree)).granted

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return total / (time.perf_counter() - started)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples (CI smoke)")
    parser.add_argument("--logs", type=Path, help="keep the replicas' logs in this directory")
    parser.add_argument("--sync", default="always", help="nats-server sync_interval")
    parser.add_argument(
        "--compare-with", type=Path, default=None, metavar="TREE",
        help="another checkout as the baseline (its sources first on PYTHONPATH)",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=5, help="interleaved rounds (--compare-with)")
    args = parser.parse_args()
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    if args.compare_with is not None:
        asyncio.run(compare(args.compare_with, args.runs, args.quick, args.sync))
    else:
        asyncio.run(main(args.quick, args.logs, args.sync))
