"""`fleet audit verify FILE` of a 10,000-event session, as a person runs it: a process that
starts, reads the export and checks every chain, and with `--keys` every signature too
(issue 13's goal: <= 2 s). The events are signed as a `fleet up` mesh signs them. Printed side
by side: the bare interpreter; the interpreter importing every command module (what any
command paid before the verify path imported only its own: `fleet --help` still does); the
start-up of the verify command alone (`verify --help`); the two verifies; and from
`-X importtime`, where the verify command's start-up goes.

    .venv/bin/python bench/cli_verify.py [--events 10000] [--runs 3] [--baseline REV]

`--baseline REV` also runs the CLI as it was at git revision REV (its `libs/` and `services/`
unpacked by `git archive` into a temporary directory, put first on `PYTHONPATH`), interleaved
run by run with today's, and prints today's time over the baseline's: on a shared machine the
absolute times move with the load, the ratio much less.
"""

import argparse
import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from fleet_events import Actor, Envelope, new_id, streams, utc_now
from fleet_events.session import TurnRequested, log_subject, session_filter
from fleet_events.signing import KeySet, Signer
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.bundle import Sealer
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

ACTOR = Actor(service="bench", replica="bench-0")


async def seed(url: str, events: int, out: Path, keyset: Path) -> None:
    nc = await connect(url)
    js = nc.jetstream()
    await bootstrap(js)
    signer = Signer.generate("agent")
    keys = KeySet.of([signer], require_signatures=True)
    await asyncio.to_thread(keyset.write_text, json.dumps(keys.to_json()))
    store = await open_store(js, streams.SESSIONS, signer=signer)
    session = new_id()
    subject = log_subject("bench", session)
    for start in range(0, events, 1000):
        batch = [
            Envelope(id=new_id(), tenant="bench", session=session, actor=ACTOR, ts=utc_now(),
                     data=TurnRequested(message=f"message {n} " + "x" * 200))
            for n in range(start, min(events, start + 1000))
        ]  # fmt: skip
        await store.append_batch(subject, batch)
    lines = [line async for line in store.export(session_filter("bench", session), keys=keys)]
    sealer = Sealer(session_filter("bench", session), signer)  # as the gateway's export ends
    for line in lines[1:]:
        row = json.loads(line)
        sealer.event(row["subject"], row["seq"], row["hash"])
    lines.append(sealer.line())
    await asyncio.to_thread(out.write_bytes, b"".join(line + b"\n" for line in lines))
    await nc.close()


ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    return elapsed


def best_of(runs: int, argv: list[str]) -> float:
    return min(timed(argv) for _ in range(runs))


def baseline_env(rev: str, into: Path) -> dict[str, str]:
    """An environment whose `PYTHONPATH` puts revision `rev`'s packages before the editable
    installs of today's."""
    roots = [
        root for root in ("libs", "apps", "services")
        if subprocess.run(["git", "cat-file", "-e", f"{rev}:{root}"], cwd=ROOT).returncode == 0
    ]  # fmt: skip
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, *roots],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    sources = sorted(str(p) for p in into.glob("*/*/src"))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sources)}


def slowest_imports(argv: list[str], top: int = 6) -> list[tuple[int, str]]:
    """The top-level imports that cost the verify command most (cumulative microseconds)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, check=False
    )
    found = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2].rstrip()
            if len(name) - len(name.lstrip()) <= 1:  # imported by the command itself
                found.append((int(parts[1]), name.strip()))
    return sorted(found, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", help="a git revision to run side by side (e.g. df79ce5)")
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        export, keyset = Path(tmp) / "session.ndjson", Path(tmp) / "keyset.json"
        server = NatsServer(store_dir=Path(tmp) / "store").start()
        try:
            asyncio.run(seed(server.url, args.events, export, keyset))
        finally:
            server.stop()
        verify = ["-m", "fleet_cli", "audit", "verify", str(export)]
        bare = best_of(args.runs, [python, "-c", "pass"])
        whole = best_of(args.runs, [python, "-c", "import fleet_cli.main; fleet_cli.main.cli()"])
        helped = best_of(args.runs, [python, "-m", "fleet_cli", "audit", "verify", "--help"])
        chains = best_of(args.runs, [python, *verify])
        signed = best_of(args.runs, [python, *verify, "--keys", str(keyset)])
        imports = slowest_imports([*verify, "--keys", str(keyset)])
        size = export.stat().st_size / 1e6
        side = ""
        if args.baseline:
            env = baseline_env(args.baseline, Path(tmp) / "baseline")
            then, now = [], []
            for _ in range(args.runs):  # interleaved: both see the same load
                then.append(timed([python, *verify, "--keys", str(keyset)], env))
                now.append(timed([python, *verify, "--keys", str(keyset)]))
            side = (
                f"\n   side by side, verify --keys, best of {args.runs}: at {args.baseline} "
                f"{min(then):.2f} s, now {min(now):.2f} s   ratio {min(now) / min(then):.2f}x"
            )
    print(
        f"== fleet audit verify of a signed {args.events:,}-event export ({size:.1f} MB), best "
        f"of {args.runs}\n"
        f"   bare interpreter {bare:.2f} s   import of every command module {whole:.2f} s   "
        f"start-up of the verify command (verify --help) {helped:.2f} s\n"
        f"   verify, chains only {chains:.2f} s\n"
        f"   verify --keys (chains and signatures) {signed:.2f} s, of which start-up "
        f"{helped / signed:.0%}   goal: <= 2 s\n"
        "   slowest imports of the verify command: "
        + ", ".join(f"{name} {us / 1e6:.2f} s" for us, name in imports)
        + side
    )


if __name__ == "__main__":
    main()
