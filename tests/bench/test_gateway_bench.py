"""bench/gateway.py keeps running as the code moves: its smallest loads, figures printed,
never asserted."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_gateway_bench_prints_fanout_projector_and_listing_figures() -> None:
    done = subprocess.run(
        [sys.executable, "bench/gateway.py", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert re.search(r"10 clients x +1000/s .* p50 [\d.]+ ms, p99 [\d.]+ ms", out), out
    assert re.search(r"100 clients x +50/s .* p50 [\d.]+ ms, p99 [\d.]+ ms", out), out
    assert "highest rate delivered in full to 100 clients" in out
    assert re.search(r"projector: [\d,]+ events/s folded .*: [\d.]+x", out), out
    assert re.search(r"GET /api/v1/sessions, [\d,]+ sessions in the tenant: p50 [\d.]+ ms", out)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_gateway_bench_compares_two_gateways_side_by_side() -> None:
    """`--compare-with` runs another checkout's gateway beside this tree's (here: this tree's
    own sources twice), round by round, and prints both and the medians."""
    done = subprocess.run(
        [sys.executable, "bench/gateway.py", "--quick", "--rounds", "1",
         "--compare-with", "services/gateway/src"],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert re.search(r"before: +10 clients x +1000/s .* p99 [\d.]+ ms", out), out
    assert re.search(r" after: +100 clients x +50/s .* p99 [\d.]+ ms", out), out
    assert re.search(r"gateway CPU [\d.]+ us per frame sent", out), out
    assert re.search(r"10 clients x +1000/s: p50 [\d.]+ \| [\d.]+, p99", out), out
