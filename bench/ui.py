"""The web UI's speed goals (issue 15), measured in the browser: a 2,000-event turn rendered live
(frame time p95 <= 50 ms) and time travel to any step of a 10,000-event session (<= 200 ms).

It serves the built UI (`ui/dist`, from ./scripts/build-ui) from a local static server and drives
its `/bench` page (ui/src/bench/BenchPage.tsx: the workspace's own panels fed synthetic frames
through the live socket's per-frame batching) in Debian's headless chromium with
ui/e2e/bench.mjs. Side by side, in interleaved rounds:

- live: the frame clock (requestAnimationFrame deltas) while a turn streams in over `--over-ms`,
  baseline = the same delivery and fold with nothing rendered (what the browser's frame clock
  gives for the model alone), project = the transcript and execution panel rendering it; also a
  burst (one event per task, as fast as the page takes them) and the trace-tree tab;
- time travel: per step (first, last, middle, spread), baseline = the fold up to that step
  alone (`viewAt`), project = the slider's change until the frame showing it is painted.

    .venv/bin/python bench/ui.py [--events 2000] [--session 10000] [--rounds 3]
"""

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from fleet_harness.bench import Stats, report, report_single, stats

ROOT = Path(__file__).resolve().parents[1]
UI = ROOT / "ui"


class _Spa(http.server.SimpleHTTPRequestHandler):
    """Static files of the build; any other path is the app (index.html), as the gateway does."""

    def send_head(self) -> Any:
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.path = "/index.html"
        return super().send_head()

    def log_message(self, format: str, *args: Any) -> None:
        return


def serve(dist: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Spa, directory=str(dist))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _ms(samples: list[float]) -> Stats:
    return stats([s / 1000 for s in samples])


def _frames(runs: list[dict[str, Any]]) -> Stats:
    return _ms([f for run in runs for f in run["frames_ms"]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="events in the live turn")
    parser.add_argument("--over-ms", type=int, default=4000, help="how long the turn streams")
    parser.add_argument("--session", type=int, default=10000, help="events in the session")
    parser.add_argument("--steps", type=int, default=20, help="time-travel steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--profile", action="store_true", help="also print where a time-travel step's time goes"
    )
    args = parser.parse_args()
    dist = UI / "dist"
    if not (dist / "index.html").is_file():
        print("bench/ui.py: no ui/dist; run ./scripts/build-ui first", file=sys.stderr)
        return 2
    node = shutil.which("node")
    if node is None:
        print("bench/ui.py: node not found", file=sys.stderr)
        return 2
    server, url = serve(dist)
    options = {"events": args.events, "overMs": args.over_ms, "session": args.session,
               "steps": args.steps, "rounds": args.rounds, "profile": args.profile}  # fmt: skip
    try:
        done = subprocess.run(
            [node, "e2e/bench.mjs", url, json.dumps(options)],
            cwd=UI, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    finally:
        server.shutdown()
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
        return 1
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["errors"]:
        print("page errors:", out["errors"], file=sys.stderr)
        return 1
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"chromium headless, {args.rounds} interleaved rounds, {os.cpu_count()} CPUs, "
          f"load average {load} (figures are wall clock: a busy machine inflates them)",
          flush=True)  # fmt: skip
    live = out["live"]
    report(
        f"live: a {args.events}-event turn streamed over {args.over_ms} ms, frame time "
        "(baseline: fold only, nothing rendered)",
        _frames(live["baseline"]), _frames(live["project"]), goal="project p95 <= 50 ms",
        unit="frame",
    )  # fmt: skip
    burst = out["burst"]
    report(
        f"live: the same {args.events} events in a burst (one per task), frame time",
        _frames(burst["baseline"]), _frames(burst["project"]), goal="project p95 <= 50 ms",
        unit="frame",
    )  # fmt: skip
    report_single(
        f"live: the {args.events}-event turn with the trace tree tab open, frame time",
        _frames(out["tree"]["project"]), goal="p95 <= 50 ms", unit="frame",
    )  # fmt: skip
    walls = [run["wall_ms"] for run in live["project"]]
    print(f"   live wall time (deliver + last paint) {min(walls):.0f}-{max(walls):.0f} ms, "
          f"{live['project'][0]['events']} events", flush=True)  # fmt: skip
    travel = out["travel"]
    base = _ms([s for run in travel["baseline"] for s in run["samples_ms"]])
    proj = _ms([s for run in travel["project"] for s in run["samples_ms"]])
    report(
        f"time travel: one step of a {travel['project'][0]['events']}-event session, to the "
        "painted frame (baseline: the fold to that step alone)",
        base, proj, goal="project max <= 200 ms", unit="step",
    )  # fmt: skip
    cold = [s for run in out["cold"]["project"] for s in run["samples_ms"]]
    print(f"   (steps taken once the page settled: its checkpoints are made in idle time) "
          f"the first jump to the last step right after loading, before any checkpoint: "
          f"{min(cold):.1f}-{max(cold):.1f} ms", flush=True)  # fmt: skip
    worst = max(s for run in travel["project"] for s in run["samples_ms"])
    commit = _ms([s for run in travel["project"] for s in run["commit_ms"]])
    print(f"   time travel worst step {worst:.1f} ms (goal <= 200 ms); of a step, the fold and "
          f"React's render and commit p50 {commit.p50_ms:.1f} ms p95 {commit.p95_ms:.1f} ms, "
          "the rest is style, layout and paint", flush=True)  # fmt: skip
    if args.profile:
        for part, what in (("live", f"the {args.events}-event live turn"),
                           ("travel", "one round of time-travel steps")):  # fmt: skip
            prof = out["profile"][part]
            print(f"== profile of {what}: {prof['total_ms']:.0f} ms sampled, self time by "
                  "function ((program) is the browser's own work: style, layout, paint; "
                  "(idle) is idle)", flush=True)  # fmt: skip
            for where, ms in prof["top"]:
                print(f"   {ms:8.1f} ms  {where}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
