"""`fleet audit verify FILE` of a 10,000-event session, as a person runs it: a process that
starts, reads the export and checks every chain (issue 13's goal: <= 2 s). The bare start of
the same interpreter importing the CLI is printed beside it, so the check's own share shows.

    .venv/bin/python bench/cli_verify.py [--events 10000] [--runs 3]
"""

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet_events import Actor, Envelope, new_id, streams, utc_now
from fleet_events.session import TurnRequested, log_subject, session_filter
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

ACTOR = Actor(service="bench", replica="bench-0")


async def seed(url: str, events: int, out: Path) -> None:
    nc = await connect(url)
    js = nc.jetstream()
    await bootstrap(js)
    store = await open_store(js, streams.SESSIONS)
    session = new_id()
    subject = log_subject("bench", session)
    for start in range(0, events, 1000):
        batch = [
            Envelope(id=new_id(), tenant="bench", session=session, actor=ACTOR, ts=utc_now(),
                     data=TurnRequested(message=f"message {n} " + "x" * 200))
            for n in range(start, min(events, start + 1000))
        ]  # fmt: skip
        await store.append_batch(subject, batch)
    lines = [line async for line in store.export(session_filter("bench", session))]
    await asyncio.to_thread(out.write_bytes, b"".join(line + b"\n" for line in lines))
    await nc.close()


def best_of(runs: int, argv: list[str]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        assert done.returncode == 0, done.stderr
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "session.ndjson"
        server = NatsServer(store_dir=Path(tmp) / "store").start()
        try:
            asyncio.run(seed(server.url, args.events, export))
        finally:
            server.stop()
        bare = best_of(args.runs, [sys.executable, "-c", "import fleet_cli.main"])
        command = [sys.executable, "-m", "fleet_cli", "audit", "verify", str(export)]
        verify = best_of(args.runs, command)
        size = export.stat().st_size / 1e6
    print(
        f"== fleet audit verify of a {args.events:,}-event export ({size:.1f} MB), best of "
        f"{args.runs}\n   whole command {verify:.2f} s   interpreter + CLI import alone "
        f"{bare:.2f} s   ratio {verify / bare:.2f}x   goal: command <= 2 s"
    )


if __name__ == "__main__":
    main()
