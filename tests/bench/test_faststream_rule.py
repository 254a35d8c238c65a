"""The decision rule of bench/faststream_runtime.py, band included (issue 8, part 3)."""

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "faststream_runtime.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("faststream_runtime", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("rpc_p50", "throughput", "moves"),
    [
        (1.10, 0.90, True),  # both clear of the 10% band
        (1.13, 0.90, False),  # RPC under 1.25x but within 10% of it
        (1.10, 0.87, False),  # throughput over 0.8x but within 10% of it
        (1.84, 0.86, False),  # this machine's figures
        (1.00, 1.20, True),
    ],
)
def test_a_median_within_ten_percent_of_a_threshold_keeps_fleet_mesh(
    rpc_p50: float, throughput: float, moves: bool
) -> None:
    decision = load_bench().decide(rpc_p50, throughput)
    assert decision.startswith("move") is moves, decision
    if not moves:
        assert decision.startswith("keep fleet_mesh as the one handler runtime")
