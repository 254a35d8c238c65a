"""bench/ui.py keeps running: small, every figure it promises printed with a number. Needs the
built UI and chromium, which `scripts/test` provides before pytest (build-ui, ui/e2e/run)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"\d+\.\d+"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ui_bench_prints_frame_times_and_time_travel_steps() -> None:
    if not (ROOT / "ui" / "dist" / "index.html").is_file() or not shutil.which("chromium"):
        pytest.fail("bench/ui.py needs ui/dist (./scripts/build-ui) and chromium (ui/e2e/run)")
    done = subprocess.run(
        [sys.executable, "bench/ui.py", "--events", "300", "--over-ms", "500", "--session",
         "1000", "--steps", "4", "--rounds", "1", "--profile"],
        cwd=ROOT, capture_output=True, text=True, timeout=360,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert re.search(r"== live: a 300-event turn streamed over 500 ms, frame time", out), out
    assert re.search(rf"project\s+{NUMBER}\s+{NUMBER}\s+\d+\n\s+ratio p50", out), out
    assert re.search(rf"trace tree tab open, frame time\n\s+p50 {NUMBER} ms\s+p95 {NUMBER}", out)
    assert re.search(r"one step of a 10\d\d-event session", out), out
    assert re.search(rf"time travel worst step {NUMBER} ms", out), out
    assert re.search(rf"right after loading, before any checkpoint: {NUMBER}-{NUMBER} ms", out)
    assert re.search(r"profile of the 300-event live turn: \d+ ms sampled", out), out
    assert re.search(r"profile of one round of time-travel steps: \d+ ms sampled", out), out
