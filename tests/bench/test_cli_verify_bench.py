"""bench/cli_verify.py keeps running: small, every figure it promises printed with a number."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_verify_bench_prints_the_start_up_and_both_verifies() -> None:
    done = subprocess.run(
        [sys.executable, "bench/cli_verify.py", "--events", "300", "--runs", "1",
         "--baseline", "HEAD"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert re.search(r"signed 300-event export", out), out
    assert re.search(r"start-up of the verify command \(verify --help\) \d+\.\d+ s", out), out
    assert re.search(r"verify, chains only \d+\.\d+ s", out), out
    assert re.search(r"verify --keys \(chains and signatures\) \d+\.\d+ s, of which start-up", out)
    assert re.search(r"slowest imports of the verify command: [\w.]+ \d+\.\d+ s", out), out
    assert re.search(r"side by side, verify --keys, .* at HEAD \d+\.\d+ s, now \d+\.\d+ s"
                     r"   ratio \d+\.\d+x", out), out  # fmt: skip
