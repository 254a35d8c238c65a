"""bench/llm.py keeps running: it prints first-token latency, tokens/s and the prefix-reuse
comparison with the real local model. Figures are never asserted, only that each is produced."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a fresh machine installs the model first (minutes)
def test_llm_bench_prints_first_token_speed_and_prefix_reuse_on_vs_off() -> None:
    done = subprocess.run(
        [sys.executable, "bench/llm.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1700,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert re.search(r"run 1: first token +\d+ ms", out)
    assert re.search(r"prompt \d+ tok at +\d+\.\d tok/s, generation \d+ tok at +\d+\.\d tok/s", out)
    assert re.search(r"evaluated/new at most \d+\.\d\dx .* first token at most \d+\.\d\dx", out)
    rows = re.findall(r"^ +(\d) \| +(\d+) \| +(\d+) +\d+ ms \| +(\d+) +\d+ ms$", out, re.M)
    assert [int(r[0]) for r in rows] == [1, 2, 3]
    # the mechanism, not a speed: with reuse on, later iterations evaluate fewer tokens than
    # the whole prompt; with it off, each evaluates the whole prompt again
    assert all(int(on) < int(off) for _, _, on, off in rows[1:])
