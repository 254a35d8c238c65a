"""What a turn's trace costs against reading the same events raw (issue 12).

Run: .venv/bin/python bench/traces.py [--turns N] [--children N] [--samples N] [--quick]

Starts its own nats-server and writes one session straight to the SESSIONS stream: `--turns`
turns, each a root run whose cell fans out to `--children` child runs (every run: started, an
LLM call, an iteration, a cell, completed; the root also a tool call, child requests and ends).
Then, side by side, interleaved:

- baseline: a raw read of the session's subjects (`read_raw` over `session_filter`, nothing
  decoded), the I/O floor every trace pays;
- project: what `GET /sessions/{id}/trace-debug` does for the last turn the first time (read,
  decode the trace types, build the span tree), again through the replica's cache (a tail
  read, then the tree), and what `trace-export` adds (the OTLP/JSON document).

Prints p50/p95 and the ratios, and a split of the project's time (read and decode, tree, OTLP)
so a missed goal says where the time goes. Goals, printed, never asserted: one turn's trace
within 4x the raw read of its session the first time, and under it when read again.
"""

import argparse
import asyncio
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from fleet_events import Actor, Envelope, Event, new_id, streams, utc_now
from fleet_events.codec import Codec
from fleet_events.run import (
    CellExecuted,
    ChildRunCompleted,
    ChildRunRequested,
    IterationPlanned,
    LlmCalled,
    RunCompleted,
    RunStarted,
    ToolCalled,
    ToolReturned,
)
from fleet_events.session import (
    SessionCreated,
    TurnCompleted,
    TurnRequested,
    TurnStarted,
    log_subject,
    run_subject,
    session_filter,
)
from fleet_gateway.traces import otlp, reading
from fleet_gateway.traces.tree import build
from fleet_harness import bench
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EventStore, open_store

TENANT, SESSION = "t-bench", "s-bench"
ACTOR = Actor(service="bench", replica="bench")
PROMPT = "the task and its context " * 40  # ~1 KB of prompt text, as a small real call has


def _env(ts: Any, data: Event, turn: str, run: str | None = None, parent: str | None = None
         ) -> Envelope[Any]:  # fmt: skip
    return Envelope(
        id=new_id(), tenant=TENANT, session=SESSION, turn=turn, run=run, parent_run=parent,
        actor=ACTOR, ts=ts, data=data,
    )  # fmt: skip


def _run(ts: Any, turn: str, run: str, parent: str | None, depth: int, index: int
         ) -> list[Envelope[Any]]:  # fmt: skip
    """One run's own events: started, the planning call, its iteration, a cell, completed."""
    call = f"{run}-l0"
    started = RunStarted(kind="rlm", tree="tree", depth=depth, task=f"task {index}",
                         parent_call="fan" if parent else "")  # fmt: skip
    llm = LlmCalled(
        role="planner", model="openai/bench", prompt_tokens=300, completion_tokens=40,
        cost=0.0004, latency_ms=120.0, call_id=call, request_kind="step",
        messages=[{"role": "user", "content": PROMPT}],  # type: ignore[list-item]
        response="```python\nprint('ok')\n```",
    )  # fmt: skip
    return [
        _env(ts, started, turn, run, parent),
        _env(ts, llm, turn, run, parent),
        _env(ts, IterationPlanned(index=0, code="print('ok')", llm_call=call), turn, run, parent),
        _env(
            ts,
            CellExecuted(
                code="print('ok')", stdout="ok\n", cell_id=f"{run}-c0", iteration=0, duration_ms=8.0
            ),
            turn,
            run,
            parent,
        ),
        _env(
            ts, RunCompleted(answer=f"answer {index}", iterations=1, llm_calls=1), turn, run, parent
        ),
    ]


async def write_session(store: EventStore, turns: int, children: int) -> str:
    log = log_subject(TENANT, SESSION)
    t = utc_now()
    await store.append(log, _env(t, SessionCreated(title="bench"), ""))
    last = ""
    for k in range(turns):
        turn = f"turn{k}"
        root = f"root{k}"
        t += timedelta(seconds=1)
        for data in (TurnRequested(message=f"question {k}"), TurnStarted(replica="a")):
            await store.append(log, _env(t, data, turn))
        root_events = _run(t, turn, root, None, 0, k)
        tool = ToolCalled(call_id="fan", tool="sub_rlm_batched", source="sandbox",
                          cell=f"{root}-c0")  # fmt: skip
        fan = [_env(t, tool, turn, root)]
        kids: list[Envelope[Any]] = []
        for c in range(children):
            kid = f"kid{k}-{c}"
            fan.append(_env(t, ChildRunRequested(child_run=kid, task="t", call_id="fan",
                                                 batch_index=c, depth=1), turn, root))  # fmt: skip
            kids.extend(_run(t, turn, kid, root, 1, c))
            fan.append(_env(t, ChildRunCompleted(child_run=kid, answer="a", child_head_hash="h",
                                                 call_id="fan"), turn, root))  # fmt: skip
        fan.append(_env(t, ToolReturned(call_id="fan", tool="sub_rlm_batched", result="a"),
                        turn, root))  # fmt: skip
        ordered = root_events[:3] + fan + root_events[3:]
        await store.append_batch(run_subject(TENANT, SESSION, root), ordered)
        for c in range(children):
            mine = kids[c * 5 : (c + 1) * 5]
            await store.append_batch(run_subject(TENANT, SESSION, f"kid{k}-{c}"), mine)
        await store.append(log, _env(t, TurnCompleted(answer=f"done {k}"), turn))
        last = turn
    return last


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="10 turns, 20 samples (smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.turns, args.samples = 10, 20
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(
            store_dir=Path(tmp) / "store", sync_interval="2m", log_path=Path(tmp) / "nats.log"
        ).start()
        try:
            await run_bench(server.url, args.turns, args.children, args.samples)
        finally:
            server.stop()


async def run_bench(url: str, turns: int, children: int, samples: int) -> None:
    nc = await connect(url, name="bench-traces")
    try:
        js = nc.jetstream()
        await bootstrap(js)
        store = await open_store(js, streams.SESSIONS)
        codec = Codec(await JetStreamBlobs.open(js))
        turn = await write_session(store, turns, children)
        count = sum([1 async for _ in store.read_raw(session_filter(TENANT, SESSION))])
        print(f"session: {turns} turns x (1 + {children}) runs, {count:,} events", flush=True)

        async def raw() -> None:
            async for _ in store.read_raw(session_filter(TENANT, SESSION)):
                pass

        async def debug() -> None:
            turns = reading.by_turn(await reading.session_events(store, codec, TENANT, SESSION))
            build(TENANT, SESSION, turn, turns[turn])

        async def export() -> None:
            turns = reading.by_turn(await reading.session_events(store, codec, TENANT, SESSION))
            otlp.export_request([build(TENANT, SESSION, turn, turns[turn])], service_version="b")

        async def listed() -> None:  # GET /traces: every turn's tree, for its summary
            turns = reading.by_turn(await reading.session_events(store, codec, TENANT, SESSION))
            for each, events in turns.items():
                build(TENANT, SESSION, each, events)

        base, proj = await bench.side_by_side(raw, debug, samples=samples, warmup=3, block=10)
        bench.report("one turn's span tree (trace-debug) vs a raw read of the session",
                     base, proj, goal="<= 4x", unit="trace")  # fmt: skip
        cache = reading.SessionCache()

        async def polled() -> None:  # a trace read again (a UI polling a turn): the tail only
            turns = reading.by_turn(await cache.events(store, codec, TENANT, SESSION))
            build(TENANT, SESSION, turn, turns[turn])

        base, proj = await bench.side_by_side(raw, polled, samples=samples, warmup=3, block=10)
        bench.report("the same trace read again, through the replica's cache (a tail read)",
                     base, proj, goal="<= 1x", unit="trace")  # fmt: skip
        base, proj = await bench.side_by_side(raw, export, samples=samples, warmup=3, block=10)
        bench.report("one turn's OTLP/JSON (trace-export) vs a raw read of the session",
                     base, proj, goal="<= 4x", unit="trace")  # fmt: skip
        base, proj = await bench.side_by_side(raw, listed, samples=samples, warmup=3, block=10)
        bench.report(f"every turn's tree ({turns} turns, GET /traces) vs the raw read",
                     base, proj, goal="<= 4x", unit="list")  # fmt: skip
        await split(store, codec, turn, samples)
    finally:
        await nc.close()


async def split(store: EventStore, codec: Codec, turn: str, samples: int) -> None:
    """Where the project's time goes: reading and decoding, the tree, the OTLP document."""
    spent = {"read+decode": 0.0, "tree": 0.0, "otlp": 0.0}
    spans = 0
    for _ in range(samples):
        t0 = time.perf_counter()
        events = reading.by_turn(await reading.session_events(store, codec, TENANT, SESSION))
        t1 = time.perf_counter()
        trace = build(TENANT, SESSION, turn, events[turn])
        t2 = time.perf_counter()
        otlp.export_request([trace], service_version="b")
        t3 = time.perf_counter()
        spent["read+decode"] += t1 - t0
        spent["tree"] += t2 - t1
        spent["otlp"] += t3 - t2
        spans = len(trace.spans)
    total = sum(spent.values())
    parts = ", ".join(
        f"{k} {v / samples * 1000:.2f} ms ({v / total:.0%})" for k, v in spent.items()
    )
    print(f"split of one export ({spans} spans): {parts}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
