"""Side-by-side benchmarks: a baseline and the project's path, interleaved in one process.

Interleaving blocks of baseline and project runs keeps machine noise (another core busy, a
GC pause) from landing on one side only. Results print p50/p95 and the project/baseline ratio;
a goal is printed beside it, never asserted.
"""

import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


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
