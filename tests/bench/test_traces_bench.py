"""bench/traces.py keeps running as the code moves: its smallest session, figures printed,
never asserted."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_traces_bench_prints_the_ratios_and_the_split() -> None:
    done = subprocess.run(
        [sys.executable, "bench/traces.py", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert re.search(r"session: 10 turns x \(1 \+ 2\) runs, [\d,]+ events", out), out
    assert out.count("ratio p50") == 4, out
    assert re.search(r"split of one export \(14 spans\): read\+decode [\d.]+ ms", out), out
