"""The fence against a replica that froze past its ack deadline, at the exact interleaving: the
replica folds the log, the replica that took its turn over appends `TurnStarted(attempt 2)`,
then the frozen one appends what it decided. Its append is refused (the log moved past the head
it folded at), it folds again, finds its attempt superseded, and records nothing."""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from fleet_agent import turns
from fleet_agent.runners import CancelToken, EchoRunner
from fleet_agent.turn_log import TurnLog
from fleet_agent.turns import SessionTurns
from fleet_agent.worker import STALE_READ_S, TurnWorker
from fleet_events import Actor, Envelope, Event, new_id
from fleet_events.session import TurnCancelled, TurnRequested, TurnStarted, TurnWork
from fleet_harness.agent_fakes import ScriptedRunner
from fleet_mesh.decider import Decided
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import AppendConflict, Appended, EventStore, Head
from fleet_mesh.work import Delivery, Retry, Settle

from .turn_kit import TERMINAL, Mesh, mesh
from .turn_kit import server as server

D = TypeVar("D", bound=Decided)
FROZEN = Actor(service="agent", replica="frozen")
TAKER = Actor(service="agent", replica="taker")


class TakenOverAfterFold:
    """On the frozen replica's `at`-th append, after it folded and decided, the other replica's
    takeover lands first (the store's `append_batch` is where the decider kernel appends)."""

    def __init__(self, store: EventStore, other: TurnLog, at: int, turn: str) -> None:
        self._real = store.append_batch
        self._other = other
        self._at = at
        self._turn = turn
        self.appends = 0
        self.refused = 0

    async def append_batch(
        self, subject: str, envelopes: Sequence[Envelope[Any]], *, expect: Head | None = None
    ) -> list[Appended]:
        self.appends += 1
        if self.appends == self._at:
            tenant, session = envelopes[0].tenant, envelopes[0].session or ""
            _, head = await self._other.load(tenant, session)
            taken = TurnStarted(replica=TAKER.replica, attempt=2)
            await self._other.append(tenant, session, self._turn, taken, expect=head)
        try:
            return await self._real(subject, envelopes, expect=expect)
        except AppendConflict:
            self.refused += 1
            raise


async def test_a_frozen_replicas_append_is_refused_and_it_records_nothing(
    server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with mesh(server, tmp_path) as m:
        t = f"t-{new_id()[:8]}"
        turn = new_id()
        seq = await m.append(t, "s", turn, TurnRequested(message="late answer"))
        taker = TurnLog(m.store, m.codec, TAKER)
        # appends: 1 = the start, 2 = the end (the takeover lands between its fold and it)
        frozen = TakenOverAfterFold(m.store, taker, 2, turn)
        monkeypatch.setattr(m.store, "append_batch", frozen.append_batch)
        worker = TurnWorker(
            m.nc, TurnLog(m.store, m.codec, FROZEN), m.codec, EchoRunner(),
            replica=FROZEN.replica, max_attempts=3, logger=logging.getLogger("test"),
        )  # fmt: skip
        work = TurnWork(tenant=t, session="s", turn=turn, requested_seq=seq)
        delivery = Delivery(
            subject="fleet.work.agent.turn", data=msgspec.json.encode(work), headers={},
            stream_seq=1, attempt=1,
        )  # fmt: skip
        assert await worker.handle(delivery) is Settle.LEAVE  # not ours to ack any more
        assert frozen.refused == 1
        facts: list[Event] = await m.of_turn(t, "s", turn)
        assert [(f.replica, f.attempt) for f in facts if isinstance(f, TurnStarted)] == [
            ("frozen", 1),
            ("taker", 2),
        ]
        assert not [f for f in facts if isinstance(f, TERMINAL)]


class DeafWorker(TurnWorker):
    """A worker whose core subscription hears nothing, as across a reconnect."""

    async def _watch_cancels(self, work: TurnWork, token: CancelToken) -> Subscription:
        return await self._nc.subscribe(f"_deaf.{new_id()}")


async def test_a_cancel_the_subscription_missed_is_read_from_the_log(
    server: NatsServer, tmp_path: Path
) -> None:
    async with mesh(server, tmp_path) as m:
        t, turn = f"t-{new_id()[:8]}", new_id()
        seq = await m.append(t, "s", turn, TurnRequested(message="one [hold:deaf] two"))
        worker = DeafWorker(
            m.nc, TurnLog(m.store, m.codec, FROZEN), m.codec, ScriptedRunner(tmp_path),
            replica=FROZEN.replica, max_attempts=3, logger=logging.getLogger("test"),
            cancel_poll_s=0.1,
        )  # fmt: skip
        work = TurnWork(tenant=t, session="s", turn=turn, requested_seq=seq)
        delivery = Delivery(
            subject="fleet.work.agent.turn", data=msgspec.json.encode(work), headers={},
            stream_seq=1, attempt=1,
        )  # fmt: skip
        handling = asyncio.create_task(worker.handle(delivery))
        await m.reached("deaf")
        await m.cancel(t, "s", turn, reason="missed by the subscription")
        assert await asyncio.wait_for(handling, 20) is Settle.ACK
        ended = await m.ended(t, "s", turn)
        assert ended == TurnCancelled(reason="missed by the subscription", partial="one", attempt=1)


class LateInterest:
    """A connection whose subscriptions reach the server late. nats.py's `subscribe` returns
    once the SUB is queued, not once the server holds the interest; here the interest arrives
    only when `flush` is awaited (what makes it certain on a real connection) or when the test
    opens `gate`, so the window a real connection leaves open by chance is held open."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self.gate = asyncio.Event()
        self._registered: list[asyncio.Task[Subscription]] = []

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]]) -> "_Later":
        async def register() -> Subscription:
            await self.gate.wait()
            sub = await self._nc.subscribe(subject, cb=cb)
            await self._nc.flush()
            return sub

        task = asyncio.create_task(register())
        self._registered.append(task)
        return _Later(task)

    async def flush(self, timeout: float = 10) -> None:
        self.gate.set()
        await asyncio.wait_for(asyncio.gather(*self._registered), timeout)


class _Later:
    def __init__(self, task: "asyncio.Task[Subscription]") -> None:
        self._task = task

    async def unsubscribe(self) -> None:
        if self._task.done():
            await self._task.result().unsubscribe()
        else:
            self._task.cancel()


class CancelRightAfterStart(TurnLog):
    """Once this worker's `TurnStarted` is stored, the user's cancel lands, and only then may
    the late subscription reach the server."""

    def __init__(self, m: Mesh, late: LateInterest, turn: str, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self._m = m
        self._late = late
        self._turn = turn

    async def submit(
        self,
        tenant: str,
        session: str,
        decide: Callable[[SessionTurns], D],
        *,
        about: Callable[[SessionTurns], tuple[str, str | None]],
    ) -> D:
        decision = await super().submit(tenant, session, decide, about=about)
        if isinstance(decision, turns.Start):
            await self._m.cancel(tenant, session, self._turn, reason="right after start")
            self._late.gate.set()
        return decision


async def test_a_cancel_stored_before_the_watch_is_live_is_not_missed(
    server: NatsServer, tmp_path: Path
) -> None:
    """The cancel is stored after the worker folded and started the turn, but before its
    subscription is live at the server: the worker must wait for the interest to be live
    before it folds, so the cancel is either in the fold or heard (the log poll is an hour
    away here, so only that can catch it). Before the fix the turn ran on, deaf to it."""
    async with mesh(server, tmp_path) as m:
        t, turn = f"t-{new_id()[:8]}", new_id()
        seq = await m.append(t, "s", turn, TurnRequested(message="one [hold:late] two"))
        late = LateInterest(m.nc)
        worker = TurnWorker(
            cast(Client, late), CancelRightAfterStart(m, late, turn, m.store, m.codec, FROZEN),
            m.codec, ScriptedRunner(tmp_path), replica=FROZEN.replica, max_attempts=3,
            logger=logging.getLogger("test"), cancel_poll_s=3600,
        )  # fmt: skip
        work = TurnWork(tenant=t, session="s", turn=turn, requested_seq=seq)
        delivery = Delivery(
            subject="fleet.work.agent.turn", data=msgspec.json.encode(work), headers={},
            stream_seq=1, attempt=1,
        )  # fmt: skip
        handling = asyncio.create_task(worker.handle(delivery))
        try:  # nothing releases the barrier: only the cancel ends this turn
            settled = await asyncio.wait_for(asyncio.shield(handling), 20)
        finally:
            m.release("late")
            await asyncio.wait_for(handling, 20)  # let it end either way, then judge it
        assert settled is Settle.ACK
        ended = await m.ended(t, "s", turn)
        assert isinstance(ended, TurnCancelled)
        assert (ended.reason, ended.attempt) == ("right after start", 1)
        assert ended.partial in ("", "one")  # stopped before or at the barrier, never past it


async def test_a_log_read_without_the_turns_request_is_delivered_again_not_dropped(
    server: NatsServer, tmp_path: Path
) -> None:
    """In a cluster a replica still catching up answers direct gets without the newest
    events: the work item's turn is then unseen by the fold. Dropping it lost the turn
    (`bench/cluster.py --chaos`: 1 of 200 turns never ended); it is delivered again, and only
    the last delivery may drop a turn no read has shown."""
    async with mesh(server, tmp_path) as m:
        t, turn = f"t-{new_id()[:8]}", new_id()
        worker = TurnWorker(
            m.nc, TurnLog(m.store, m.codec, FROZEN), m.codec, EchoRunner(),
            replica=FROZEN.replica, max_attempts=3, logger=logging.getLogger("test"),
        )  # fmt: skip
        # the request at seq 1 of a log whose read holds nothing yet: a stale replica's answer
        work = TurnWork(tenant=t, session="s", turn=turn, requested_seq=1)

        def delivery(attempt: int) -> Delivery:
            return Delivery(
                subject="fleet.work.agent.turn", data=msgspec.json.encode(work), headers={},
                stream_seq=1, attempt=attempt,
            )  # fmt: skip

        first = await worker.handle(delivery(1))
        assert isinstance(first, Retry), first
        assert first.delay_s == STALE_READ_S
        assert isinstance(await worker.handle(delivery(2)), Retry)
        assert await worker.handle(delivery(3)) is Settle.ACK  # the last: nothing to run
        # once the read holds the request, the same work item runs the turn
        seq = await m.append(t, "s2", turn, TurnRequested(message="now seen"))
        work = TurnWork(tenant=t, session="s2", turn=turn, requested_seq=seq)
        assert await worker.handle(delivery(2)) is Settle.ACK
        ended = await m.ended(t, "s2", turn)
        assert not isinstance(ended, TurnCancelled)
        assert ended is not None
