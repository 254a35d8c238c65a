"""Gateway benchmark, side by side in one run (issue 11), on a nats-server of its own and the
gateway as a real process:

1. WebSocket fan-out: clients in another process on one session's passive feed
   (`/api/v1/ws/execution/events`), a writer appending to that session at a fixed rate.
   Latency is envelope `ts` (taken just before the append) → the client reading the frame, so
   it includes the append itself. Two loads: 10 clients at 1,000 events/s and 100 clients at
   50 events/s (goal p99 ≤ 50 ms); then, per load, the rate doubles until a socket is closed
   (4008) or an event goes missing: the highest rate that delivered everything is printed.
   Beside each load: a bare core-NATS subscriber in the clients' process (the floor this
   machine allows at that moment: no gateway in between), and the gateway's CPU per frame
   sent, which scheduling on a loaded machine does not move as much as latency.
2. Projector throughput: the gateway's projector folding N stored events vs a raw batched
   read of the same stream (goal ≥ 0.8x).
3. `GET /api/v1/sessions` of a tenant with 10,000 sessions: p50 (goal ≤ 20 ms).

Run: `.venv/bin/python bench/gateway.py [--quick]`. Figures print; nothing is asserted.
Before / after a change, side by side in one run: `git worktree add /tmp/before <commit>`, then
`.venv/bin/python bench/gateway.py --compare-with /tmp/before/services/gateway/src` (the
fan-out loads only, the two gateways alternating round by round).
"""

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from fleet_events import Actor, Envelope, bus, new_id, streams, utc_now
from fleet_events.bus import Ping
from fleet_events.codec import Codec
from fleet_events.session import SessionCreated, SessionRenamed, log_subject
from fleet_gateway.projections import ProjectionStore, Projector
from fleet_harness.procs import Launcher
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer, free_port
from fleet_mesh.store import EMPTY, EventStore, Head, open_store
from fleet_mesh.tokens import issue_token, signing_secret

WRITER = Actor(service="bench", replica="bench")
TENANT = "bench"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


# -- the client process ------------------------------------------------------------------------


async def clients_main(spec: dict[str, Any]) -> None:
    """Open every socket, say "ready" on stdout, read until `expected` events or a close each,
    then print one JSON line of results."""
    from websockets.asyncio.client import connect as ws_connect
    from websockets.exceptions import ConnectionClosed

    sockets = [
        await ws_connect(
            f"{spec['url']}?ticket={t}&session_id={spec['session']}&after_seq={spec['after']}",
            max_size=None,
        )
        for t in spec["tickets"]
    ]
    # The floor, measured beside the sockets in this same process: a bare core-NATS
    # subscriber on the session's log gets every append with no gateway in between.
    floor: list[float] = []

    async def bare(msg: Any) -> None:
        sent = datetime.fromisoformat(json.loads(msg.data)["ts"]).timestamp()
        floor.append((time.time() - sent) * 1000)

    nc = await connect(spec["nats_url"], name="bench-floor")
    await nc.subscribe(spec["subject"], cb=bare)
    await nc.flush()
    print("ready", flush=True)
    latencies: list[float] = []
    closes: list[int] = []
    counts: list[int] = []

    async def read(ws: Any) -> None:
        got = 0
        try:
            while got < spec["expected"]:
                frame = json.loads(await asyncio.wait_for(ws.recv(), spec["timeout"]))
                now = time.time()
                if frame["type"] != "event":
                    continue
                got += 1
                sent = datetime.fromisoformat(frame["event"]["ts"]).timestamp()
                latencies.append((now - sent) * 1000)
        except ConnectionClosed as exc:
            closes.append(exc.rcvd.code if exc.rcvd is not None else 1006)
        except TimeoutError:
            pass
        counts.append(got)
        await ws.close()

    await asyncio.gather(*(read(ws) for ws in sockets))
    await nc.close()
    out = {"latencies": latencies, "closes": closes, "counts": counts, "floor": floor}
    print(json.dumps(out), flush=True)


# -- the parent --------------------------------------------------------------------------------


HEADS: dict[str, Head] = {}


async def append(store: EventStore, session: str, title: str) -> int:
    """One append, expecting the head this writer left (one round trip, no head lookup)."""
    env = Envelope(
        id=new_id(), tenant=TENANT, session=session, actor=WRITER, ts=utc_now(),
        data=SessionRenamed(title=title),
    )  # fmt: skip
    done = await store.append(log_subject(TENANT, session), env, expect=HEADS.get(session, EMPTY))
    HEADS[session] = done.head
    return done.seq


async def tickets(base: str, token: str, n: int) -> list[str]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        got = []
        for _ in range(n):
            r = await client.post(
                "/api/v1/auth/ws-ticket", headers={"Authorization": f"Bearer {token}"}
            )
            got.append(r.json()["ticket"])
        return got


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; nan elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def fanout(
    store: EventStore, base: str, token: str, clients: int, rate: int, seconds: float, tmp: Path,
    nats_url: str, gateway_pid: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    session = new_id()
    after = await append(store, session, "start")
    events = int(rate * seconds)
    spec = {
        "url": base.replace("http://", "ws://") + "/api/v1/ws/execution/events",
        "session": session, "after": after, "expected": events, "timeout": 10.0,
        "tickets": await tickets(base, token, clients),
        "nats_url": nats_url, "subject": log_subject(TENANT, session),
    }  # fmt: skip
    spec_path = tmp / f"spec-{session}.json"
    spec_path.write_text(json.dumps(spec))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--clients", str(spec_path),
        stdout=subprocess.PIPE, limit=2**28,
    )  # fmt: skip
    assert proc.stdout is not None
    assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
    cpu_before = cpu_s(gateway_pid)
    start = time.perf_counter()
    for i in range(events):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await append(store, session, f"event {i}")
    achieved = events / (time.perf_counter() - start)
    out = json.loads((await asyncio.wait_for(proc.stdout.readline(), 120)).decode())
    cpu_used = cpu_s(gateway_pid) - cpu_before
    await proc.wait()
    complete = not out["closes"] and all(c == events for c in out["counts"])
    return {
        "clients": clients, "rate": rate, "achieved": achieved, "events": events,
        "p50": pct(out["latencies"], 0.50), "p99": pct(out["latencies"], 0.99),
        "floor_p50": pct(out["floor"], 0.50), "floor_p99": pct(out["floor"], 0.99),
        "closes": len(out["closes"]), "complete": complete,
        "cpu_us": cpu_used / max(1, sum(out["counts"])) * 1e6, "load": os.getloadavg()[0],
    }  # fmt: skip


def line(r: dict[str, Any]) -> str:
    return (
        f"  {r['clients']:>3} clients x {r['rate']:>5}/s (writer reached {r['achieved']:.0f}/s): "
        f"p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, closes {r['closes']}, "
        f"all delivered: {r['complete']}\n"
        f"      beside it, a bare NATS subscriber (the floor): p50 {r['floor_p50']:.1f} ms, "
        f"p99 {r['floor_p99']:.1f} ms; gateway CPU {r['cpu_us']:.0f} us per frame sent; "
        f"load average {r['load']:.1f}"
    )


async def projector_vs_raw(nc: Any, js: Any, store: EventStore, events: int) -> None:
    sessions = [new_id() for _ in range(max(1, events // 20))]
    for i in range(events):
        await append(store, sessions[i % len(sessions)], f"p{i}")
    codec = Codec(await JetStreamBlobs.open(js))
    raw_s, proj_s = [], []
    for _ in range(3):  # interleaved: raw, projector, raw, projector ...
        t = time.perf_counter()
        n_raw = sum([1 async for _ in store.read_raw("fleet.session.>")])
        raw_s.append(time.perf_counter() - t)
        models = ProjectionStore(None)
        t = time.perf_counter()
        n_proj = await Projector(nc, store, codec, models).catch_up()
        proj_s.append(time.perf_counter() - t)
        models.close()
    raw, proj = statistics.median(raw_s), statistics.median(proj_s)
    print(
        f"projector: {n_proj / proj:,.0f} events/s folded vs raw batched read "
        f"{n_raw / raw:,.0f} events/s over {n_raw:,} events: {raw / proj:.2f}x (goal ≥ 0.8x)"
    )


async def list_sessions(store: EventStore, base: str, token: str, count: int) -> None:
    last = 0
    for i in range(count):
        session = new_id()
        env = Envelope(
            id=new_id(), tenant="lister", session=session, actor=WRITER, ts=utc_now(),
            data=SessionCreated(title=f"session {i}"),
        )  # fmt: skip
        last = (await store.append(log_subject("lister", session), env)).seq
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=headers) as client:
        r = await client.get("/api/v1/sessions", params={"min_seq": last})
        assert r.status_code == 200, r.text
        times = []
        for _ in range(200):
            t = time.perf_counter()
            r = await client.get("/api/v1/sessions", params={"limit": 20})
            times.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.text
    print(
        f"GET /api/v1/sessions, {count:,} sessions in the tenant: p50 {pct(times, 0.5):.2f} ms, "
        f"p99 {pct(times, 0.99):.2f} ms over {len(times)} requests (goal p50 ≤ 20 ms)"
    )


GATEWAY_ENV = {
    # the bench measures the routes, not the per-tenant rate limit in front of them
    "FLEET_GATEWAY_TENANT_RPS": "100000", "FLEET_GATEWAY_TENANT_BURST": "100000",
}  # fmt: skip


async def compare(before_src: Path, rounds: int, seconds: float) -> None:
    """The fan-out loads only, side by side in one run: a gateway from `before_src` (the
    `services/gateway/src` of another checkout, e.g. a `git worktree` of an older commit)
    and this tree's, each started fresh, alternating round by round so both meet the same
    machine; per round one line each, then the medians."""
    import httpx as client_lib

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        nats = NatsServer(store_dir=tmp / "nats", sync_interval="2m").start()
        nc = await connect(nats.url, name="bench-gateway")
        await bootstrap(nc.jetstream(), env={})
        store = await open_store(nc.jetstream(), streams.SESSIONS)
        variants = {"before": {"PYTHONPATH": str(before_src)}, "after": {}}
        seen: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
        try:
            for _ in range(rounds):
                for name, extra in variants.items():
                    port, data = free_port(), tmp / "gw"
                    launcher = Launcher(nats_url=nats.url, log_dir=tmp)
                    (gateway,) = launcher.start("gateway", env={
                        "FLEET_GATEWAY_PORT": str(port), "FLEET_GATEWAY_DATA_DIR": str(data),
                        **GATEWAY_ENV, **extra,
                    })  # fmt: skip
                    base = f"http://127.0.0.1:{port}"
                    async with client_lib.AsyncClient() as http:
                        for _ in range(600):
                            try:
                                if (await http.get(base + "/health")).status_code == 200:
                                    break
                            except client_lib.HTTPError:  # not listening yet
                                pass
                            await asyncio.sleep(0.05)
                    token = issue_token(signing_secret(data), tenant=TENANT, user="bench")
                    try:
                        for clients, rate in ((10, 1000), (100, 50)):
                            r = await fanout(
                                store, base, token, clients, rate, seconds, tmp=tmp,
                                nats_url=nats.url, gateway_pid=gateway.pid,
                            )  # fmt: skip
                            print(f"{name:>6}:" + line(r)[1:], flush=True)
                            seen.setdefault((name, clients, rate), []).append(r)
                    finally:
                        launcher.stop_all()
            print("medians over the rounds (before | after):")
            for clients, rate in ((10, 1000), (100, 50)):
                cells = []
                for key in ("p50", "p99", "floor_p99", "cpu_us"):
                    b, a = (
                        statistics.median(r[key] for r in seen[(n, clients, rate)])
                        for n in variants
                    )
                    cells.append(f"{key} {b:.1f} | {a:.1f}")
                print(f"  {clients:>3} clients x {rate:>5}/s: " + ", ".join(cells))
        finally:
            await nc.close()
            nats.stop()


async def main(quick: bool) -> None:
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        nats = NatsServer(store_dir=tmp / "nats", sync_interval="2m").start()
        nc = await connect(nats.url, name="bench-gateway")
        js = nc.jetstream()
        await bootstrap(js, env={})
        store = await open_store(js, streams.SESSIONS)
        port, data = free_port(), tmp / "gw"
        launcher = Launcher(nats_url=nats.url, log_dir=tmp)
        (gateway,) = launcher.start("gateway", env={
            "FLEET_GATEWAY_PORT": str(port), "FLEET_GATEWAY_DATA_DIR": str(data), **GATEWAY_ENV,
        })  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    await rpc.call_verb(nc, bus.ping("gateway"), Ping(), timeout=0.5)
                    break
                except Exception:  # not up yet
                    await asyncio.sleep(0.05)
            token = issue_token(signing_secret(data), tenant=TENANT, user="bench")
            seconds = 1.5 if quick else 3.0
            print("WebSocket fan-out, store → client (goal p99 ≤ 50 ms):")
            for clients, rate in ((10, 1000), (100, 50)):
                run = functools.partial(
                    fanout, store, base, token, clients, tmp=tmp, nats_url=nats.url,
                    gateway_pid=gateway.pid,
                )  # fmt: skip
                first = await run(rate, seconds)
                print(line(first))
                best = first["achieved"] if first["complete"] else 0.0
                probe = rate * 2
                while best >= rate * 0.9 and probe <= rate * (4 if quick else 16):
                    r = await run(probe, seconds)
                    print(line(r))
                    if not r["complete"]:
                        break
                    best = max(best, r["achieved"])
                    if r["achieved"] < probe * 0.9:
                        break  # the writer, not the gateway, is the limit from here
                    probe *= 2
                print(
                    f"  highest rate delivered in full to {clients} clients without a close: "
                    f"{best:.0f} events/s"
                )
            await projector_vs_raw(nc, js, store, 2_000 if quick else 10_000)
            lister = issue_token(signing_secret(data), tenant="lister", user="bench")
            await list_sessions(store, base, lister, 1_000 if quick else 10_000)
        finally:
            launcher.stop_all()
            await nc.close()
            nats.stop()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--clients":
        asyncio.run(clients_main(json.loads(Path(sys.argv[2]).read_text())))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--quick", action="store_true", help="smaller loads (a smoke run)")
        parser.add_argument(
            "--compare-with", type=Path, metavar="GATEWAY_SRC",
            help="only the fan-out loads, this tree's gateway beside the one in GATEWAY_SRC "
            "(another checkout's services/gateway/src), alternating rounds",
        )  # fmt: skip
        parser.add_argument("--rounds", type=int, default=3, help="rounds of --compare-with")
        args = parser.parse_args()
        if args.compare_with is not None:
            before = args.compare_with.resolve()
            asyncio.run(compare(before, args.rounds, 1.5 if args.quick else 3.0))
        else:
            asyncio.run(main(args.quick))
