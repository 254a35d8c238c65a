"""A dead replica loses nothing: agent replicas as real processes, reached at a point in a turn by
a barrier in the scripted runner (never by timing), then SIGKILLed or frozen with SIGSTOP.

The ack deadline is 1 s here (`FLEET_AGENT_ACK_WAIT_S`), so a lost delivery comes back fast."""

import os
import signal
from pathlib import Path

import pytest

from fleet_events import Event, new_id
from fleet_events.session import TurnCompleted, TurnFailed, TurnStarted
from fleet_harness.procs import Replica
from fleet_harness.waits import eventually
from fleet_mesh.natsserver import NatsServer

from .turn_kit import TERMINAL, Mesh, agent, agent_env, launcher, mesh, settings, wait_ready
from .turn_kit import server as server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def barriers(tmp_path: Path) -> Path:
    path = tmp_path / "barriers"
    path.mkdir()
    return path


def named(replicas: list[Replica], name: str) -> Replica:
    return next(r for r in replicas if r.env["FLEET_REPLICA"] == name)


async def assert_ended_once(m: Mesh, tenant: str, session: str, turn: str) -> None:
    """Exactly one terminal event, no event stored twice, and the work item acked."""
    events = await m.events(tenant, session)
    terminal = [e for e in events if isinstance(e.envelope.data, TERMINAL)]
    assert len(terminal) == 1, [type(e.envelope.data).__name__ for e in events]
    ids = [e.envelope.id for e in events]
    assert len(ids) == len(set(ids))

    async def settled() -> bool:
        info = await m.turn_consumer()
        return info.num_ack_pending == 0 and info.num_pending == 0

    await eventually(settled, timeout=10, what="the turn's work item to be acked")


async def test_a_replica_killed_mid_turn_has_its_turn_finished_by_another_exactly_once(
    server: NatsServer, tmp_path: Path, barriers: Path
) -> None:
    launch = launcher(server, tmp_path)
    try:
        async with mesh(server, barriers) as m:
            replicas = launch.start("agent", 2, env=agent_env(barriers))
            await wait_ready(m.nc, replicas)
            t = f"t-{new_id()[:8]}"
            turn = await m.request(t, "s", "before [hold:k] after")
            holder = await m.reached("k")
            named(replicas, holder).kill()
            m.release("k")
            ended = await m.wait_ended(t, "s", turn, timeout=30)
            assert ended == TurnCompleted(answer="before after")
            survivor = next(r for r in replicas if r.alive()).env["FLEET_REPLICA"]
            started = [
                (f.attempt, f.replica)
                for f in await m.of_turn(t, "s", turn)
                if isinstance(f, TurnStarted)
            ]
            assert started == [(1, holder), (2, survivor)]
            await assert_ended_once(m, t, "s", turn)
    finally:
        launch.stop_all()


async def test_a_poison_turn_ends_with_turn_failed_naming_why(
    server: NatsServer, tmp_path: Path, barriers: Path
) -> None:
    """`[die]` SIGKILLs whichever replica runs it; dead replicas are restarted as an operator's
    supervisor would. After `max_attempts` deliveries the next one only records the failure."""
    launch = launcher(server, tmp_path)
    try:
        async with mesh(server, barriers) as m:
            replicas = launch.start("agent", 2, env=agent_env(barriers, max_attempts=2))
            await wait_ready(m.nc, replicas)
            t = f"t-{new_id()[:8]}"
            turn = await m.request(t, "s", "this [die] kills its replica")

            async def failed() -> TurnFailed | None:
                for replica in replicas:
                    if not replica.alive():
                        replica.start()
                ended = await m.ended(t, "s", turn)
                return ended if isinstance(ended, TurnFailed) else None

            ended = await eventually(failed, timeout=60, interval=0.1, what="the poison turn")
            assert ended.code == "poison"
            assert ended.retryable is False
            assert "delivered 2 times and never finished" in ended.error
            assert "died or timed out" in ended.error
            attempts = [
                f.attempt for f in await m.of_turn(t, "s", turn) if isinstance(f, TurnStarted)
            ]
            assert attempts == [1, 2]
            await assert_ended_once(m, t, "s", turn)
    finally:
        launch.stop_all()


async def test_a_replica_frozen_past_its_deadline_then_thawed_records_nothing(
    server: NatsServer, tmp_path: Path, barriers: Path
) -> None:
    launch = launcher(server, tmp_path)
    try:
        async with mesh(server, barriers) as m:
            replicas = launch.start("agent", 2, env=agent_env(barriers))
            await wait_ready(m.nc, replicas)
            t = f"t-{new_id()[:8]}"
            turn = await m.request(t, "s", "one [hold:f] two")
            frozen = named(replicas, await m.reached("f", attempt=1))
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                taker = await m.reached("f", attempt=2, timeout=30)  # past the 1 s deadline
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
            assert taker != frozen.env["FLEET_REPLICA"]
            m.release("f")  # both runners now finish; only the live attempt may record it
            assert await m.wait_ended(t, "s", turn) == TurnCompleted(answer="one two")
            await eventually(
                lambda: "turn superseded" in frozen.logs(), timeout=15,
                what="the thawed replica to find its turn taken over",
            )  # fmt: skip
            events = await m.events(t, "s")
            (completed,) = [e for e in events if isinstance(e.envelope.data, TERMINAL)]
            assert completed.envelope.actor.replica == taker
            await assert_ended_once(m, t, "s", turn)
    finally:
        launch.stop_all()


async def test_a_nats_server_killed_mid_turn_loses_and_duplicates_nothing(
    tmp_path: Path, barriers: Path
) -> None:
    """DESIGN §7.2 for the server: SIGKILL nats-server (`sync_interval: always`) while a turn
    is held, start it again on the same store; the agent reconnects and ends the turn once."""
    nats = NatsServer(
        store_dir=tmp_path / "durable", sync_interval="always", log_path=tmp_path / "n.log"
    ).start()
    try:
        async with mesh(nats, barriers) as m, agent(nats, settings(barriers)):
            t = f"t-{new_id()[:8]}"
            turn = await m.request(t, "s", "across [hold:n] restarts")
            await m.reached("n")
            nats.kill()
            nats.start()
            m.release("n")
            ended = await m.wait_ended(t, "s", turn, timeout=60)
            assert ended == TurnCompleted(answer="across restarts")
            await assert_ended_once(m, t, "s", turn)
    finally:
        nats.stop()


async def test_a_replica_dead_after_storing_the_end_but_before_its_ack_has_nothing_repeated(
    server: NatsServer, tmp_path: Path, barriers: Path
) -> None:
    """The crash point between `TurnCompleted` stored and the ack: the end is written (as the
    holder would have written it) while the holder is held, then the holder is SIGKILLed. The
    redelivery must be acked with nothing run or recorded again."""
    launch = launcher(server, tmp_path)
    try:
        async with mesh(server, barriers) as m:
            replicas = launch.start("agent", 2, env=agent_env(barriers))
            await wait_ready(m.nc, replicas)
            t = f"t-{new_id()[:8]}"
            turn = await m.request(t, "s", "[hold:e] answered")
            holder = named(replicas, await m.reached("e"))
            await m.append(t, "s", turn, TurnCompleted(answer="answered"))
            holder.kill()
            m.release("e")  # a wrongly repeated run would now go through and record again
            await assert_ended_once(m, t, "s", turn)  # waits for the redelivery's ack
            assert kinds_of(await m.of_turn(t, "s", turn)) == [
                "TurnRequested", "TurnStarted", "TurnCompleted",
            ]  # fmt: skip
            assert not (barriers / "e.reached.2").exists()
    finally:
        launch.stop_all()


def kinds_of(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]
