"""Turns as durable work, one agent in the test's loop against a real nats-server: a turn appended
to a session's log (no gateway: the test appends `TurnRequested` itself) runs and ends exactly
once; a second request while one runs is refused and recorded; a cancel stops the turn at its
next step with the partial answer; slots bound what a replica runs; progress keeps a long turn
from being redelivered."""

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from nats.js.api import ConsumerInfo

from fleet_events import new_id
from fleet_events.session import (
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRefused,
    TurnStarted,
    log_subject,
)
from fleet_harness.waits import eventually
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.service import ServiceContext

from .turn_kit import TERMINAL, Mesh, agent, mesh, settings
from .turn_kit import server as server

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def barriers(tmp_path: Path) -> Path:
    path = tmp_path / "barriers"
    path.mkdir()
    return path


@pytest.fixture
async def m(server: NatsServer, barriers: Path) -> AsyncIterator[Mesh]:
    async with mesh(server, barriers) as opened:
        yield opened


@pytest.fixture
async def one_agent(server: NatsServer, m: Mesh, barriers: Path) -> AsyncIterator[ServiceContext]:
    async with agent(server, settings(barriers)) as ctx:
        yield ctx


def tenant() -> str:
    return f"t-{new_id()[:10]}"


def kinds(events: Sequence[object]) -> list[str]:
    return [type(e).__name__ for e in events]


async def test_a_requested_turn_runs_and_ends_exactly_once(
    m: Mesh, one_agent: ServiceContext
) -> None:
    t = tenant()
    turn = await m.request(t, "s1", "hello mesh world")
    ended = await m.wait_ended(t, "s1", turn)
    assert ended == TurnCompleted(answer="hello mesh world")
    facts = await m.of_turn(t, "s1", turn)
    assert kinds(facts) == ["TurnRequested", "TurnStarted", "TurnCompleted"]
    started = facts[1]
    assert isinstance(started, TurnStarted)
    assert (started.replica, started.attempt) == ("agent-0", 1)
    # acked only once its end was stored: nothing is left pending or in the queue
    await eventually(lambda: _settled(m), what="the turn's work item to be acked")


async def _settled(m: Mesh) -> ConsumerInfo | None:
    info = await m.turn_consumer()
    return info if info.num_ack_pending == 0 and info.num_pending == 0 else None


async def test_a_second_request_while_one_runs_is_refused_and_recorded(
    m: Mesh, one_agent: ServiceContext
) -> None:
    t = tenant()
    first = await m.request(t, "s", "first [hold:one] done")
    await m.reached("one")
    second = await m.request(t, "s", "second")
    refused = await eventually(lambda: _refusal(m, t, second), what="the second request's refusal")
    assert refused.reason == "busy"
    assert refused.active_turn == first
    assert first in refused.message
    assert "cancel" in refused.message
    m.release("one")
    assert await m.wait_ended(t, "s", first) == TurnCompleted(answer="first done")
    # the refused one was never started, and is refused exactly once
    assert kinds(await m.of_turn(t, "s", second)) == ["TurnRequested", "TurnRefused"]
    # once the first has ended the session takes the next turn
    third = await m.request(t, "s", "third")
    assert await m.wait_ended(t, "s", third) == TurnCompleted(answer="third")


async def _refusal(m: Mesh, t: str, turn: str) -> TurnRefused | None:
    for event in await m.of_turn(t, "s", turn):
        if isinstance(event, TurnRefused):
            return event
    return None


async def test_two_racing_requests_cannot_both_start(m: Mesh, one_agent: ServiceContext) -> None:
    import asyncio

    t = tenant()
    a, b = await asyncio.gather(
        m.request(t, "s", "a [hold:race] a"), m.request(t, "s", "b [hold:race] b")
    )
    await m.reached("race")
    refused = await eventually(
        lambda: _any_refusal(m, t), what="one of the racing requests to be refused"
    )
    m.release("race")
    winner = a if refused.active_turn == a else b
    loser = b if winner == a else a
    assert refused.active_turn == winner
    await m.wait_ended(t, "s", winner)
    events = await m.events(t, "s")
    started = [e.envelope.turn for e in events if isinstance(e.envelope.data, TurnStarted)]
    assert started == [winner]
    assert [e.envelope.turn for e in events if isinstance(e.envelope.data, TurnRefused)] == [loser]


async def _any_refusal(m: Mesh, t: str) -> TurnRefused | None:
    for stored in await m.events(t, "s"):
        if isinstance(stored.envelope.data, TurnRefused):
            return stored.envelope.data
    return None


async def test_a_cancel_stops_the_turn_at_its_next_step_with_the_partial_answer(
    m: Mesh, one_agent: ServiceContext
) -> None:
    t = tenant()
    turn = await m.request(t, "s", "one two [hold:c] three four")
    await m.reached("c")
    await m.cancel(t, "s", turn, reason="changed my mind")
    ended = await m.wait_ended(t, "s", turn)
    assert ended == TurnCancelled(reason="changed my mind", partial="one two", attempt=1)
    assert kinds(await m.of_turn(t, "s", turn)) == [
        "TurnRequested", "TurnStarted", "CancelRequested", "TurnCancelled",
    ]  # fmt: skip


async def test_a_turn_cancelled_before_it_starts_never_starts(
    server: NatsServer, m: Mesh, barriers: Path
) -> None:
    t = tenant()
    async with agent(server, settings(barriers, turn_slots=1)):
        busy = await m.request(t, "busy", "[hold:slot] x")
        await m.reached("slot")
        waiting = await m.request(t, "other", "never run")
        # its work item waits for the one slot; the cancel lands first
        await eventually(lambda: _queued(m), what="the second turn's work item to be queued")
        await m.cancel(t, "other", waiting)
        m.release("slot")
        assert await m.wait_ended(t, "other", waiting) == TurnCancelled(reason="user")
        await m.wait_ended(t, "busy", busy)
    assert kinds(await m.of_turn(t, "other", waiting)) == [
        "TurnRequested", "CancelRequested", "TurnCancelled",
    ]  # fmt: skip


async def _queued(m: Mesh) -> bool:
    return (await m.turn_consumer()).num_pending == 1


async def test_a_replica_runs_at_most_its_slots_and_holds_no_more_work(
    server: NatsServer, m: Mesh, barriers: Path
) -> None:
    t = tenant()
    async with agent(server, settings(barriers, turn_slots=2)) as ctx:
        held = [await m.request(t, f"s{i}", f"[hold:h{i}] {i}") for i in range(3)]

        async def two_running_one_waiting() -> bool:
            info = await m.turn_consumer()
            # two delivered and unacked, one never delivered, and no pull request waiting:
            # a replica without a free slot asks the server for nothing
            return (info.num_ack_pending, info.num_pending, info.num_waiting) == (2, 1, 0)

        await eventually(two_running_one_waiting, what="two turns running, one queued")
        started = [i for i in range(3) if (m.barriers / f"h{i}.reached.1").exists()]
        assert len(started) == 2
        for i in range(3):
            m.release(f"h{i}")
        for i, turn in enumerate(held):
            assert await m.wait_ended(t, f"s{i}", turn) == TurnCompleted(answer=str(i))
        assert ctx.ping_details()["turns_peak"] == 2


async def test_progress_keeps_a_turn_longer_than_its_ack_deadline_from_redelivery(
    server: NatsServer, m: Mesh, barriers: Path
) -> None:
    t = tenant()
    async with agent(server, settings(barriers, ack_wait_s=1.5, turn_slots=2)) as ctx:
        turn = await m.request(t, "s", "[hold:long] done")
        await m.reached("long")
        # progress goes out every third of the deadline: six reports span two deadlines (a
        # 1.5 s deadline leaves a loaded machine a second of slack between reports)
        await eventually(
            lambda: ctx.ping_details()["progress_sent"] >= 6, timeout=10,
            what="six progress reports",
        )  # fmt: skip
        info = await m.turn_consumer()
        assert info.num_redelivered == 0
        assert not (m.barriers / "long.reached.2").exists()
        m.release("long")
        assert await m.wait_ended(t, "s", turn) == TurnCompleted(answer="done")
    facts = await m.of_turn(t, "s", turn)
    assert [f.attempt for f in facts if isinstance(f, TurnStarted)] == [1]


async def test_a_failing_runner_ends_the_turn_without_leaking_its_error_text(
    m: Mesh, one_agent: ServiceContext
) -> None:
    t = tenant()
    turn = await m.request(t, "s", "before [fail] after")
    ended = await m.wait_ended(t, "s", turn)
    assert isinstance(ended, TurnFailed)
    assert (ended.code, ended.retryable, ended.attempt) == ("runner_error", True, 1)
    assert "ScriptedFailure" in ended.error
    assert "agent-0" in ended.error
    assert "scripted failure" not in ended.error  # the exception's own text stays in the log
    terminal = [f for f in await m.of_turn(t, "s", turn) if isinstance(f, TERMINAL)]
    assert len(terminal) == 1


async def test_a_message_too_large_to_store_inline_still_runs(
    m: Mesh, one_agent: ServiceContext
) -> None:
    """Over 256 KiB the request (and the answer) live in the object store behind a stub."""
    t = tenant()
    message = " ".join(f"w{i}" for i in range(60_000))  # ~400 KB
    turn = await m.request(t, "s", message)
    ended = await m.wait_ended(t, "s", turn)
    assert ended == TurnCompleted(answer=message)
    raw = [r async for r in m.store.read_raw(log_subject(t, "s"))]
    assert all(len(r.data) < 64 * 1024 for r in raw)  # every stored one is a stub or small
