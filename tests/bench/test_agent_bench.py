"""bench/agent.py keeps running as the code moves: small sizes, every part's figures printed,
never asserted (the goals are printed beside them)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_agent_bench_prints_each_part() -> None:
    done = subprocess.run(
        [sys.executable, "bench/agent.py", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-4000:]
    # part 1, at both latencies: the ratio, the overhead per iteration and the profile
    assert len(re.findall(r"10-iteration RLM trajectory \(20 llm_query, 2 sub_rlm\)", out)) == 2
    assert len(re.findall(r"mesh overhead per iteration .*: -?\d+\.\d+ ms", out)) == 2
    assert len(re.findall(r"profile of the mesh run", out)) == 2
    assert len(re.findall(r"an llm_query -?\d+\.\d+ ms .*; a step call -?\d+\.\d+ ms", out)) == 2
    assert re.search(r"ratio p50 \d+\.\d+x .* goal: <= 1\.15x wall", out), out
    # part 4: the checkpoint's cost against the loop's cell time
    assert re.search(r"checkpoint cost per cell \(p50 difference\): -?\d+\.\d+ ms", out), out
    # part 2: both replica counts, CPU per service, occupancy, the ratio
    assert re.search(r"1 replica\(s\): +\d+\.\d+ turns/s", out), out
    assert re.search(r"2 replica\(s\): +\d+\.\d+ turns/s", out), out
    assert re.search(r"CPU ms per turn: agent-0 \d+\.\d+, agent-1 \d+\.\d+, budget", out), out
    assert re.search(r"ratio 2/1: \d+\.\d+x +goal: >= 1\.8x", out), out
    # part 3: bench/turns.py's figure
    assert re.search(r"TurnRequested stored -> TurnStarted stored.*\n +p50 \d+\.\d+ ms  p99", out)
