"""Resume latency (issue 16): SIGKILL of a turn's holder → the turn's next stored step
(`run.resumed` on the root run's subject) written by the other replica.

Run: `.venv/bin/python bench/resume.py [--samples N] [--ack-waits 1,2]`. Per ack deadline, a
mesh of its own (a broker, the budget service and two agent replicas as processes, the scripted
LM, a FAKE model server, in this process) runs `--samples` turns of the crash matrix's "before
a step" case (tests/integration/agent/resume_kit.py): the root's second step call waits at the
fake's gate, the holder is SIGKILLed, and the clock stops when the resumed run's `run.resumed`
reaches a core subscription on the run subject (the stream delivers what it has stored). The
killed replica is started again before the next sample. Printed: p50 and p99 per ack deadline,
with the part the deadline explains (redelivery comes `ack_wait` after the holder's last
progress, which it sends every third of it: between 2/3 and all of it after a kill).

Goal (issue 16): p50 <= 2 s with the ack deadline tests use (1 s). The figure is printed,
never asserted.
"""

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test kits live in tests/
# the bench's model server is a fake on loopback, and a tenant's profile may reach public
# addresses only: this bench deployment allows loopback, as the suite does (conftest.py)
os.environ.setdefault("FLEET_EGRESS_ALLOW", "127.0.0.0/8")

from nats.aio.msg import Msg
from tests.integration.agent.resume_kit import AGENT_ENV, Case, agents, holder, script
from tests.integration.agent.rlm_kit import session, start_mesh, stop_mesh

from fleet_agent.engine import root_run_id
from fleet_events.catalog import type_of_class
from fleet_events.chain import TYPE_HEADER
from fleet_events.run import RunResumed
from fleet_events.session import TurnCompleted, run_subject
from fleet_harness.scripted_lm import Gate, ScriptedLM
from fleet_harness.waits import eventually

RESUMED = type_of_class(RunResumed)


def _reached(gate: Gate) -> bool:
    return gate.arrivals >= 1


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def measure(root: Path, ack_wait: float, samples: int) -> tuple[list[float], int]:
    env = {
        **AGENT_ENV,
        "FLEET_AGENT_ACK_WAIT_S": str(ack_wait),
        "FLEET_ENGINE_ACK_WAIT_S": str(ack_wait),
        # a loaded runner's live holders can miss a 1 s deadline and be taken over too: room
        # for that, so a sample is not cut short by the poison rule
        "FLEET_AGENT_MAX_ATTEMPTS": "10",
    }
    processes = await asyncio.to_thread(start_mesh, root, env, None, 2)
    times: list[float] = []
    extra = 0
    try:
        names = agents(processes)
        with ScriptedLM(script) as fake:
            async with session(processes) as s:
                await s.use_model(fake)
                for n in range(samples):
                    case = Case("step", n)
                    gate = fake.gate(case.key("gate"))
                    turn = await s.ask(case.message)
                    run = root_run_id(s.tenant, s.session, turn)
                    arrived: asyncio.Future[float] = asyncio.get_running_loop().create_future()

                    async def on_step(msg: Msg, arrived: asyncio.Future[float] = arrived) -> None:
                        if (msg.headers or {}).get(TYPE_HEADER) == RESUMED and not arrived.done():
                            arrived.set_result(time.perf_counter())

                    sub = await s.nc.subscribe(run_subject(s.tenant, s.session, run), cb=on_step)
                    await s.nc.flush()
                    await eventually(partial(_reached, gate), timeout=60)
                    name = await holder(s, turn)
                    killed_at = time.perf_counter()
                    names[name].kill()
                    gate.release()
                    times.append(await asyncio.wait_for(arrived, 120) - killed_at)
                    await sub.unsubscribe()
                    ended = await s.ended(turn, timeout=120)
                    assert isinstance(ended, TurnCompleted), ended
                    extra += len([e for e in await s.run_events(turn) if isinstance(e, RunResumed)])
                    extra -= 1
                    names[name].restart()
    finally:
        await asyncio.to_thread(stop_mesh, processes)
    return times, extra


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--ack-waits", default="1,2", help="ack deadlines to run, in seconds")
    args = parser.parse_args()
    print("SIGKILL of the holder -> run.resumed stored by the other replica (2 agent replicas)")
    for ack_wait in [float(a) for a in args.ack_waits.split(",")]:
        with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
            measured, extra = await measure(Path(tmp), ack_wait, args.samples)
        times = sorted(measured)
        p50, p99 = percentile(times, 0.5), percentile(times, 0.99)
        print(
            f"ack_wait {ack_wait:g} s: {len(times)} kills  p50 {p50:.2f} s  p99 {p99:.2f} s  "
            f"mean {statistics.fmean(times):.2f} s  min {times[0]:.2f} s  "
            f"(p50 minus 5/6 of the deadline: {p50 - ack_wait * 5 / 6:+.2f} s; "
            f"takeovers of a live holder besides the kills: {extra})"
        )
    print(
        "goal: p50 <= 2 s at the tests' 1 s deadline. The wait is the deadline's: redelivery "
        "comes ack_wait after the last progress (sent every third of it), 5/6 of ack_wait after "
        "a kill on average, plus the fixed part above; at the production 30 s, about 25 s plus it"
    )


if __name__ == "__main__":
    asyncio.run(main())
