"""bench/resume.py keeps running as the code moves: two kills, its figure printed, never
asserted."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_bench_prints_kill_to_next_step_p50_and_p99() -> None:
    done = subprocess.run(
        [sys.executable, "bench/resume.py", "--samples", "2", "--ack-waits", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "SIGKILL of the holder -> run.resumed stored by the other replica" in done.stdout
    assert re.search(r"ack_wait 2 s: 2 kills  p50 \d+\.\d+ s  p99 \d+\.\d+ s", done.stdout)
