"""The broker's benchmarks keep running: each runs small and prints its figures (never asserted:
a timed assertion is noise on a shared machine)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*argv: str, timeout: float = 240) -> str:
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_list_bench_prints_timeouts_ping_and_memory() -> None:
    out = run_bench("bench/broker_list.py", "--calls", "60", "--live", "30", "--filler", "100")
    assert re.search(r"list timeouts \(5 s\): \d+", out)
    assert re.search(r"under load p50 [\d.]+ ms, p95 [\d.]+ ms, ratio [\d.]+x", out)
    assert re.search(r"broker RSS \d+ MB -> \d+ MB, ratio [\d.]+x", out)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_interrupt_bench_times_both_kinds_of_cell() -> None:
    out = run_bench("bench/interrupt.py", "--samples", "2")
    for kind in ("busy loop", "sleep(60)"):
        assert re.search(rf"{re.escape(kind)}: interrupt -> reply p50 [\d.]+ ms", out), out
