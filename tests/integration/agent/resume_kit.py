"""The crash matrix of issue 16: a turn's holder SIGKILLed at a point reached by a barrier (a
gate in the scripted LM, a FAKE model server, or the worker's before-ack barrier), the turn
resumed from its record by the other replica, and every invariant checked per kill:

- the turn ends exactly once, and as it would have without the kill (the answer needs a
  variable a recorded cell made, so a fresh REPL context would not reach it);
- no event is stored twice: on the log one `TurnStarted` per attempt, on every run subject of
  the turn (root and children) no two events record the same step (`journal.step_key`), one
  `run.started`, one end;
- no model call is repeated beyond the one in flight (counted at the fake, per script key).

The killed replica is started again (same name) before the next round, so every round has two
replicas. Each crash point has a module (and a mesh) of its own.
"""

import asyncio
import collections
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet_events import Event
from fleet_events.journal import step_key
from fleet_events.run import TERMINAL, ChildRunRequested, RunResumed, RunStarted
from fleet_events.session import TurnCancelled, TurnCompleted, TurnFailed, TurnStarted, log_subject
from fleet_harness.procs import Replica
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import WaitTimeout, eventually

from .rlm_kit import Processes, Session, of_type, step

KILLS = int(os.environ.get("FLEET_RESUME_KILLS", "10"))
"""Kills per crash point (the issue asks ten; fewer only to try a change quickly)."""
AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "2",
    # 2 s, not the 1 s of the other kill tests: on a loaded 2-core runner a live holder's
    # progress (every third of it) was seen late enough to be taken over while alive
    "FLEET_AGENT_ACK_WAIT_S": "2",
    "FLEET_ENGINE_ACK_WAIT_S": "2",
    "FLEET_ENGINE_CHILD_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "4",
}


@dataclass
class Case:
    """One round: the turn's marker `n` (its keys and gates are its own) and what it wants."""

    kind: str
    n: int

    def key(self, name: str) -> str:
        return f"{self.kind}{self.n}:{name}"

    @property
    def message(self) -> str:
        return f"ROOTTASK {self.kind} {self.n}"

    @property
    def answer(self) -> str:
        return {"step": "42", "cell": "42ok", "children": "42AB", "ack": "42", "clock": "42ok"}[
            self.kind
        ]


def script(request: ScriptedRequest) -> Reply:
    """The model's side of every crash point, by markers in the prompt (module docstring)."""
    text = request.prompt_text
    root = re.search(r"ROOTTASK (\w+) (\d+)", text)
    if root is None:
        sub = re.search(r"SUBQ (\w+) (\d+)", text)
        if sub is not None:
            case = Case(sub.group(1), int(sub.group(2)))
            return Reply("ok", key=case.key("sub"), gate=case.key("gate"))
        kid = re.search(r"KIDTASK (alpha|beta) (\w+) (\d+)", text)
        assert kid, f"a request from no run of the script: {text[-300:]!r}"
        case = Case(kid.group(2), int(kid.group(3)))
        answer = "A" if kid.group(1) == "alpha" else "B"
        return Reply(
            step(f"SUBMIT(answer={answer!r})"), key=case.key(kid.group(1)), gate=case.key("gate")
        )
    case = Case(root.group(1), int(root.group(2)))
    return _root(case, text)


def _root(case: Case, text: str) -> Reply:
    made = "MADE-X" in text
    if case.kind == "ack":
        return Reply(step("x = 41\nSUBMIT(answer=str(x + 1))"), key=case.key("s1"))
    if case.kind == "children":
        if "KIDS-DONE" not in text:
            fan = (
                f"x = 41\nanswers = sub_rlm_batched(['KIDTASK alpha children {case.n}', "
                f"'KIDTASK beta children {case.n}'])\nprint('KIDS-DONE', answers)"
            )
            return Reply(step(fan), key=case.key("s1"))
        return Reply(step("SUBMIT(answer=str(x + 1) + ''.join(answers))"), key=case.key("s2"))
    if not made:
        if case.kind == "clock":  # prints what a replay cannot print again
            made_x = "import random\nx = 41\nprint('MADE-X', random.random())"
            return Reply(step(made_x), key=case.key("s1"))
        return Reply(step("x = 41\nprint('MADE-X')"), key=case.key("s1"))
    if case.kind == "step":
        return Reply(step("SUBMIT(answer=str(x + 1))"), key=case.key("s2"), gate=case.key("gate"))
    if "GOT-Y" not in text:
        ask = f"y = llm_query('SUBQ {case.kind} {case.n}')\nprint('GOT-Y', y)"
        return Reply(step(ask), key=case.key("s2"))
    return Reply(step("SUBMIT(answer=str(x + 1) + y)"), key=case.key("s3"))


EXPECTED: dict[str, dict[str, tuple[int, int]]] = {
    # script key -> (fewest, most) calls: exactly once, or twice for the call in flight
    "step": {"s1": (1, 1), "s2": (2, 2)},
    "cell": {"s1": (1, 1), "s2": (1, 1), "sub": (2, 2), "s3": (1, 1)},
    # a child on the killed replica repeats its one step in flight; one on the survivor not
    "children": {"s1": (1, 1), "s2": (1, 1), "alpha": (1, 2), "beta": (1, 2)},
    "ack": {"s1": (1, 1)},
}


@dataclass
class Round:
    case: Case
    turn: str
    killed: str
    kill_to_step_s: float
    events: dict[str, list[Event]] = field(default_factory=dict)


def agents(processes: Processes) -> dict[str, Replica]:
    return {r.env["FLEET_REPLICA"]: r for r in processes.replicas if r.service == "agent"}


async def holder(s: Session, turn: str) -> str:
    async def latest() -> str | None:
        started = [
            e.data
            for e in await s.read(log_subject(s.tenant, s.session))
            if e.turn == turn and isinstance(e.data, TurnStarted)
        ]
        return started[-1].replica if started else None

    return await eventually(latest, timeout=30, what=f"turn {turn} to start")


async def run_rounds(
    processes: Processes,
    s: Session,
    fake: ScriptedLM,
    kind: str,
    reach: Callable[[Case, str], "asyncio.Future[None] | object"],
    *,
    kills: int = KILLS,
) -> list[Round]:
    """`kills` rounds of: ask, wait at the barrier (`reach`), SIGKILL the holder, release,
    wait for the end, check every invariant, start the killed replica again."""
    names = agents(processes)
    rounds = []
    for n in range(kills):
        case = Case(kind, n)
        fake.gate(case.key("gate"))  # made before the call, or the call does not wait
        turn = await s.ask(case.message)
        await reach_barrier(reach, case, turn)
        name = await holder(s, turn)
        names[name].kill()
        killed_at = time.monotonic()
        fake.gate(case.key("gate")).release()
        stored = await next_step_after(s, turn, killed_at)
        try:
            ended = await s.ended(turn, timeout=90)
        except WaitTimeout as exc:
            raise AssertionError(f"{case}: {await where(s, turn)}") from exc
        assert isinstance(ended, TurnCompleted), (case, ended, names[name].logs()[-3000:])
        assert ended.answer == case.answer, (case, ended.answer)
        round_ = Round(case, turn, name, stored)
        await check_round(s, fake, round_)
        names[name].restart()
        rounds.append(round_)
    return rounds


async def where(s: Session, turn: str) -> str:
    """Where a turn that did not end stands: its root run's steps, one line each."""
    lines = []
    for event in await s.run_events(turn):
        detail = {
            k: str(getattr(event, k))[:160]
            for k in ("cell_id", "code", "stdout", "error", "request_hash", "in_flight")
            if getattr(event, k, "")
        }
        lines.append(f"{type(event).__name__} {detail}")
    return "\n".join(lines)


async def reach_barrier(reach: Callable[[Case, str], object], case: Case, turn: str) -> None:
    waited = reach(case, turn)
    if asyncio.iscoroutine(waited):
        await waited


async def next_step_after(s: Session, turn: str, killed_at: float) -> float:
    """Seconds from the kill to the next event stored on the turn's root run subject (the
    takeover's `run.resumed`), or to the redelivery's ack when the turn had already ended."""
    run = await s.run_events(turn)
    before = len(run)
    if isinstance(run[-1], TERMINAL):
        return 0.0

    async def grew() -> bool:
        return len(await s.run_events(turn)) > before

    await eventually(grew, timeout=60, interval=0.01, what="the resumed run's next step")
    return time.monotonic() - killed_at


async def check_round(s: Session, fake: ScriptedLM, round_: Round) -> None:
    case, turn = round_.case, round_.turn
    log = [e for e in await s.read(log_subject(s.tenant, s.session)) if e.turn == turn]
    ends = [e for e in log if isinstance(e.data, TERMINAL_TURN)]
    assert len(ends) == 1, (case, [type(e.data).__name__ for e in log])
    attempts = [e.data.attempt for e in log if isinstance(e.data, TurnStarted)]
    assert attempts == sorted(set(attempts)), (case, attempts)
    ids = [e.id for e in log]
    assert len(ids) == len(set(ids))
    root = await s.run_events(turn)
    runs = {"root": root}
    for child in of_type(root, ChildRunRequested):
        runs[child.child_run] = await s.events_of(child.child_run)
    for name, events in runs.items():
        keys = [k for k in map(step_key, events) if k is not None]
        doubled = [k for k, c in collections.Counter(keys).items() if c > 1]
        assert not doubled, (case, name, doubled)
        assert len(of_type(events, RunStarted)) == 1, (case, name)
        assert isinstance(events[-1], TERMINAL), (case, name, events[-1])
    if case.kind != "ack":
        assert of_type(root, RunResumed), (case, "the root run was not resumed")
    round_.events = runs
    for name, (fewest, most) in EXPECTED[case.kind].items():
        calls = fake.calls[case.key(name)]
        assert fewest <= calls <= most, (case, name, calls, dict(fake.calls))
    mine = {k for k in fake.calls if k.startswith(f"{case.kind}{case.n}:")}
    assert mine == {case.key(name) for name in EXPECTED[case.kind]}, (case, mine)


TERMINAL_TURN = (TurnCompleted, TurnFailed, TurnCancelled)


def gate_reached(fake: ScriptedLM, arrivals: int = 1) -> Callable[[Case, str], object]:
    async def reached(case: Case, _turn: str) -> None:
        gate = fake.gate(case.key("gate"))
        await eventually(lambda: gate.arrivals >= arrivals, timeout=60, what=f"{case} at its gate")

    return reached


def ended_barrier(barriers: Path) -> Callable[[Case, str], object]:
    async def reached(case: Case, turn: str) -> None:
        await eventually(
            lambda: (barriers / f"{turn}.ended.1").exists(), timeout=60, what=f"{case} ended"
        )

    return reached


def summary(rounds: list[Round]) -> str:
    times = sorted(r.kill_to_step_s for r in rounds)
    return f"{len(rounds)} kills, kill -> next stored step: max {times[-1]:.2f}s"
