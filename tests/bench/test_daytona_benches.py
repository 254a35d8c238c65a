"""The Daytona benches run small: the provider against the SDK alone, and the fork profile."""

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
def test_the_provider_bench_prints_its_overhead_above_the_sdk() -> None:
    out = run_bench("bench/daytona_provider.py", "20")
    assert len(re.findall(r"provider overhead p50 -?\d+\.\d+ ms", out)) == 2, out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fork_profile_prints_each_step_on_both_providers() -> None:
    out = run_bench("bench/broker_fork_profile.py", "3")
    for provider in ("local", "daytona"):
        assert re.search(rf"== fork on {provider}: request/reply p50 \d+\.\d+ ms", out), out
    assert "append sandbox.forked" in out
    assert "each Daytona call in it" in out
