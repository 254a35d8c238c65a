"""Side-by-side benchmarks: a baseline and the project's path, interleaved in one process.

Interleaving blocks of baseline and project runs keeps machine noise (another core busy, a
GC pause) from landing on one side only. Results print p50/p95 and the project/baseline ratio;
a goal is printed beside it, never asserted.
"""

import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Stats:
    samples: int
    p50_ms: float
    p95_ms: float
    mean_ms: float

    @property
    def per_second(self) -> float:
        return 1000.0 / self.mean_ms if self.mean_ms else float("inf")


def stats(samples_s: list[float]) -> Stats:
    ordered = sorted(samples_s)
    n = len(ordered)
    return Stats(
        samples=n,
        p50_ms=ordered[n // 2] * 1000,
        p95_ms=ordered[min(n - 1, int(n * 0.95))] * 1000,
        mean_ms=statistics.fmean(ordered) * 1000,
    )


async def side_by_side(
    baseline: Callable[[], Awaitable[object]],
    project: Callable[[], Awaitable[object]],
    *,
    samples: int = 500,
    warmup: int = 20,
    block: int = 25,
) -> tuple[Stats, Stats]:
    for _ in range(warmup):
        await baseline()
        await project()
    times: dict[str, list[float]] = {"baseline": [], "project": []}
    done = 0
    while done < samples:
        step = min(block, samples - done)
        for name, fn in (("baseline", baseline), ("project", project)):
            for _ in range(step):
                start = time.perf_counter()
                await fn()
                times[name].append(time.perf_counter() - start)
        done += step
    return stats(times["baseline"]), stats(times["project"])


def report(title: str, baseline: Stats, project: Stats, *, goal: str, unit: str = "call") -> str:
    """Print (and return) one comparison block; a ratio above 1 means the project is slower."""
    lines = [
        f"== {title}",
        f"   {'':10} {'p50 ms':>10} {'p95 ms':>10} {f'{unit}/s':>12}",
        f"   {'baseline':10} {baseline.p50_ms:10.3f} {baseline.p95_ms:10.3f} "
        f"{baseline.per_second:12.0f}",
        f"   {'project':10} {project.p50_ms:10.3f} {project.p95_ms:10.3f} "
        f"{project.per_second:12.0f}",
        f"   ratio p50 {project.p50_ms / baseline.p50_ms:.2f}x  "
        f"p95 {project.p95_ms / baseline.p95_ms:.2f}x   goal: {goal}",
    ]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def report_single(title: str, measured: Stats, *, goal: str = "", unit: str = "call") -> str:
    text = (
        f"== {title}\n   p50 {measured.p50_ms:.3f} ms  p95 {measured.p95_ms:.3f} ms  "
        f"{measured.per_second:.0f} {unit}/s" + (f"   goal: {goal}" if goal else "")
    )
    print(text, flush=True)
    return text


async def measure(fn: Callable[[], Awaitable[object]], *, samples: int, warmup: int = 5) -> Stats:
    for _ in range(warmup):
        await fn()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return stats(times)


# -- another checkout as the baseline (`--compare-with TREE`) ------------------------------------

SOURCE_ROOTS = ("libs/*/src", "apps/*/src", "services/*/src")


def sources_of(tree: Path) -> str:
    """A checkout's source folders as a PYTHONPATH, so a process run with it first imports that
    tree's code (the venv's editable installs come after). E.g. `git archive REV | tar -x -C
    /tmp/base` makes a baseline tree."""
    found = [str(p) for pattern in SOURCE_ROOTS for p in sorted(tree.glob(pattern))]
    if not found:
        raise SystemExit(f"--compare-with {tree}: no {', '.join(SOURCE_ROOTS)} there")
    return ":".join(found)


def sides_in_turn(runs: int) -> list[tuple[int, str]]:
    """The order of `runs` interleaved rounds: baseline first in even rounds, project first in
    odd ones, so neither side always runs on a warmer (or busier) machine."""
    order = []
    for index in range(runs):
        pair = ("baseline", "project") if index % 2 == 0 else ("project", "baseline")
        order += [(index, side) for side in pair]
    return order


def report_rounds(
    title: str,
    baseline: list[float],
    project: list[float],
    *,
    unit: str,
    higher_is_better: bool,
    goal: str = "<= 1.05x",
) -> float:
    """Print one figure measured in interleaved rounds: each side's median, and the median and
    spread (min-max) of the per-round cost ratios, project over baseline (above 1: the project
    is slower, whatever the unit). Returns the median ratio."""
    ratios = sorted(
        (b / p if higher_is_better else p / b) for b, p in zip(baseline, project, strict=True)
    )
    median = statistics.median(ratios)
    print(
        f"== {title} ({len(ratios)} interleaved rounds)\n"
        f"   baseline median {statistics.median(baseline):,.3f} {unit}   project median "
        f"{statistics.median(project):,.3f} {unit}\n"
        f"   cost ratio median {median:.3f}x  spread {ratios[0]:.3f}x-{ratios[-1]:.3f}x   "
        f"goal: {goal}",
        flush=True,
    )
    return median
