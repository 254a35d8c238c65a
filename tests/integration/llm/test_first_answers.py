"""The first questions a new user asks, on the embedded default model (slow tier; issue 20's
task suite): computable ones go to one sandbox cell and come back right, or fail saying why;
never completed with a wrong answer. Questions code does not compute stay with chain of
thought (the `run.compute_decided` event says so).

The whole mesh as processes (an agent replica with the chat runner, a real budget service and
sandbox broker, real sandboxes) and the real local model server behind `fleet up`'s own profile
(temperature 0, a seed: the same answers every run on this kind of machine). Each task's wall
time, the answer and the load average are printed for the note (`-s`).
"""

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fleet_agent.run.failures import code_of
from fleet_cli.localllm import server
from fleet_events import new_id
from fleet_events.run import ComputeDecided, LlmCalled, ToolCalled
from fleet_events.session import (
    TURN_FAILURES,
    DocumentLoaded,
    DocumentRef,
    TurnCompleted,
    TurnFailed,
    TurnRequested,
)
from fleet_mesh.blobs import JetStreamBlobs

from ..agent.rlm_kit import Processes, Session, of_type, processes, session
from .test_real_model_turns import answering, installed, model, use_local_model

__all__ = ["installed", "model", "processes"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

AGENT_ENV = {"FLEET_AGENT_RUNNER": "chat", "FLEET_AGENT_TURN_SLOTS": "1"}
TURN_TIMEOUT_S = 900.0

HAYSTACK = (
    "\n".join(f"line {n} NEEDLE" if n % 13 == 0 else f"line {n} hay" for n in range(1, 301)) + "\n"
)
SALES = "region,units,price\n" + "".join(
    f"{region},{units},{price}\n"
    for region, units, price in [
        ("north", 12, 3.5), ("south", 7, 4.0), ("east", 30, 2.25), ("west", 5, 10.0),
        ("north", 9, 3.5), ("east", 11, 2.25),
    ]
)  # fmt: skip
MODULE = '''"""A small module of the repository under question."""


def scale(value, factor=3):
    return value * factor


def offset(value, by=10):
    return value + by


def clamp(value, low=0, high=100):
    return max(low, min(high, value))


def describe(value):
    return f"value={value}"
'''


@dataclass(frozen=True)
class Task:
    question: str
    right: str
    """The answer's first line when right."""
    computable: bool = True
    document: tuple[str, str] | None = None  # (alias, text)


TASKS = [
    Task("What is 17 * 23?", "391"),
    Task("What is 2345 + 6789?", "9134"),
    Task("What is 37 * 41?", "1517"),
    Task("How many lines contain NEEDLE?", "23", document=("hay", HAYSTACK)),
    Task("What is the sum of the units column?", "74", document=("sales", SALES)),
    Task("How many functions does the attached module define?", "4", document=("mod", MODULE)),
]
NOT_COMPUTABLE = [
    Task("What is the capital of France?", "Paris", computable=False),
    Task("Say hello in French.", "Bonjour", computable=False),
]


@pytest.fixture(scope="module")
def results() -> Iterator[list[str]]:
    lines: list[str] = []
    yield lines
    print("\n".join(["", "first answers on the embedded model:", *lines]), flush=True)


async def ask(s: Session, task: Task) -> tuple[TurnCompleted | TurnFailed, list[object], float]:
    turn = new_id()
    documents: tuple[str, ...] = ()
    if task.document is not None:
        alias, text = task.document
        blobs = await JetStreamBlobs.open(s.nc.jetstream())
        blob = await blobs.put(s.tenant, text.encode())
        doc = DocumentRef(
            alias=alias, source="upload", origin=f"{alias}.txt", blob=blob, chars=len(text)
        )
        await s.append(None, DocumentLoaded(document=doc))
        documents = (alias,)
    started = time.monotonic()
    await s.append(turn, TurnRequested(message=task.question, document_ids=documents))
    ended = await s.ended(turn, timeout=TURN_TIMEOUT_S)
    assert isinstance(ended, TurnCompleted | TurnFailed), ended
    return ended, list(await s.run_events(turn)), time.monotonic() - started


def outcome(
    task: Task, ended: TurnCompleted | TurnFailed, seconds: float, events: list[object]
) -> str:
    load = os.getloadavg()[0]
    if isinstance(ended, TurnFailed):
        cells = [c.args.get("code") for c in of_type(events, ToolCalled)]  # type: ignore[arg-type]
        return (
            f"- {task.question!r}: failed {ended.code} in {seconds:.0f} s (load {load:.1f}); "
            f"its cells: {cells!r}"
        )
    first = ended.answer.strip().splitlines()[0] if ended.answer.strip() else ""
    verdict = "right" if task.right.lower() in first.lower() else "WRONG"
    return (
        f"- {task.question!r}: {verdict} {first[:60]!r} by {ended.answered_by} in "
        f"{seconds:.0f} s (load {load:.1f})"
    )


async def asked(
    processes: Processes, model: tuple[server.ServerConfig, str], results: list[str], task: Task
) -> tuple[TurnCompleted | TurnFailed, ComputeDecided, list[object]]:
    """`task` asked in a session of its own on the embedded model; its outcome noted."""
    config, key = model
    await answering(config, key)
    async with session(processes) as s:
        await use_local_model(s, processes, config.api_base, key)
        ended, events, seconds = await ask(s, task)
    results.append(outcome(task, ended, seconds, events))
    (decided,) = of_type(events, ComputeDecided)  # type: ignore[arg-type]
    return ended, decided, events


@pytest.mark.parametrize("task", TASKS, ids=[t.question[:30] for t in TASKS])
async def test_a_computable_question_is_right_or_fails_saying_why(
    processes: Processes,
    model: tuple[server.ServerConfig, str],
    results: list[str],
    task: Task,
) -> None:
    ended, decided, _ = await asked(processes, model, results, task)
    assert decided.computable, decided
    if isinstance(ended, TurnFailed):  # an honest failure: a stated code, never a guess
        assert ended.code in TURN_FAILURES, ended
        assert code_of(ended.code).stated, ended  # not the runner breaking
        return
    assert ended.answered_by == "code", ended
    assert ended.answer.strip().splitlines()[0] == task.right, ended.answer
    assert "computed in the sandbox by" in ended.answer  # the cell, cited


@pytest.mark.parametrize("task", NOT_COMPUTABLE, ids=[t.question[:30] for t in NOT_COMPUTABLE])
async def test_a_question_code_does_not_compute_stays_with_chain_of_thought(
    processes: Processes,
    model: tuple[server.ServerConfig, str],
    results: list[str],
    task: Task,
) -> None:
    ended, decided, events = await asked(processes, model, results, task)
    assert (decided.computable, decided.rule) == (False, "none")
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answered_by == "cot"
    assert of_type(events, LlmCalled)  # type: ignore[arg-type]
