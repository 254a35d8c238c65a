"""bench/turns.py keeps running as the code moves: small, its figure printed, never asserted."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_turn_bench_prints_requested_to_started_p50_and_p99() -> None:
    done = subprocess.run(
        [sys.executable, "bench/turns.py", "--samples", "30", "--warmup", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "TurnRequested stored -> TurnStarted stored" in done.stdout
    assert re.search(r"p50 \d+\.\d+ ms  p99 \d+\.\d+ ms", done.stdout), done.stdout
