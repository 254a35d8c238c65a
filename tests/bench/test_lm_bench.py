"""bench/lm.py keeps running as the code moves: it prints both comparisons, with numbers
(never asserted: a timed assertion is noise on a shared machine)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_lm_bench_prints_the_overhead_and_the_ratio() -> None:
    done = subprocess.run(
        [sys.executable, "bench/lm.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert "model latency 0 ms: budgeted LM" in out
    assert "model latency 100 ms: budgeted LM" in out
    assert len(re.findall(r"overhead per call p50 -?\d+\.\d+ ms", out)) == 2
    assert len(re.findall(r"ratio p50 \d+\.\d+x", out)) == 3
