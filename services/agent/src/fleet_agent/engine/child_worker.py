"""The child-run work consumer: take a child run, run it, delete its sandbox, ack.

Every agent replica runs one, with slots of its own (`FLEET_ENGINE_CHILD_SLOTS`), apart from
the turn slots: a turn's root never waits for a slot its own children need. A child run that
waits on children of its own lends its slot back meanwhile (`SlotLease`), so one replica with
two slots runs a tree of any depth and fan-out: every slot is held by a run that is working,
never by one that is waiting.

A child run is resumed like a turn's root (issue 16, `engine.resume`): a redelivery that finds
the run started (its holder died or froze past the ack deadline) runs it again from its
record, which first appends `run.resumed` and so fences the old holder. A fresh delivery
(attempt 1) of a run already started is a second publish of the same child (past the
dedup window): dropped, the first item is held or will be redelivered. The last delivery
(`MAX_ATTEMPTS` + 1) runs nothing: it records `run.failed` (`replica_lost`, retryable) against
the head it found, and the parent's `sub_rlm` returns that error. A child whose turn has
ended, or was cancelled, stops at its next step; it watches the session's log for either, as
the turn worker watches for cancels.
"""

import asyncio
import contextlib
import logging

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from fleet_agent.domain import CHILD_ATTEMPTS, child_lost
from fleet_agent.engine.mesh import MeshPool
from fleet_agent.engine.model import EngineMesh, RlmTask, RunContext, SlotLease, in_own_thread
from fleet_agent.engine.rlm import run_rlm
from fleet_agent.turn_log import TurnLog
from fleet_events import Envelope, InvalidId, check_id, new_id, utc_now
from fleet_events.catalog import type_of_class
from fleet_events.chain import TYPE_HEADER
from fleet_events.codec import CodecError
from fleet_events.run import TERMINAL, ChildRunWork
from fleet_events.session import (
    CancelRequested,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    log_subject,
    run_subject,
)
from fleet_mesh.store import AppendConflict, Head
from fleet_mesh.work import Delivery, Settle, WorkConsumer

STOPS = (CancelRequested, TurnCompleted, TurnFailed, TurnCancelled)
STOP_TYPES = frozenset(type_of_class(cls) for cls in STOPS)

MAX_ATTEMPTS = CHILD_ATTEMPTS
"""Deliveries of a child run that may run it; the next records it lost (`max_deliver` is this
plus one, `EngineSettings.child_consumer`)."""


class ChildRunWorker:
    def __init__(self, pool: MeshPool, logger: logging.Logger) -> None:
        self._pool = pool
        self._log = logger
        self._decode = msgspec.json.Decoder(ChildRunWork).decode
        self.consumer: WorkConsumer | None = None

    async def handle(self, delivery: Delivery) -> Settle:
        try:
            work = self._decode(delivery.data)
            for kind in ("tenant", "session", "turn", "tree", "parent_run", "child_run", "sandbox"):
                check_id(kind, getattr(work, kind))
        except (msgspec.DecodeError, msgspec.ValidationError, InvalidId) as exc:
            self._log.error("malformed child-run work item: dropped", extra={"why": str(exc)})
            return Settle.TERM
        mesh = await self._pool.get(work.tenant)
        subject = run_subject(work.tenant, work.session, work.child_run)
        last = await mesh.on_bus(mesh.store.last(subject))
        if last is not None:
            if isinstance(last.envelope.data, TERMINAL):
                await self._reap(mesh, work)
                return Settle.ACK
            if delivery.attempt == 1:
                self._log.info("child run already started: duplicate item dropped",
                               extra={"run": work.child_run})  # fmt: skip
                return Settle.ACK
            if delivery.attempt > MAX_ATTEMPTS:
                if not await self._record_lost(mesh, work, Head(last.seq, last.hash)):
                    return Settle.LEAVE
                await self._reap(mesh, work)
                return Settle.ACK
        ctx = self._context(mesh, work, delivery.attempt)
        watch = await mesh.on_bus(self._watch(mesh, work, ctx))
        try:
            if await self._turn_over(mesh, work):
                ctx.cancel.set("the turn has ended")
            result = await run_rlm(_task(work), ctx)
        finally:
            await mesh.on_bus(_unsubscribe(watch))
            await self._reap(mesh, work)
            if ctx.sandbox != work.sandbox:  # a resume moved the run to a fork: it goes too
                with contextlib.suppress(Exception):
                    await in_own_thread(mesh.bus.delete_sandbox, ctx.sandbox)
        if result.fenced:
            return Settle.LEAVE  # another holder owns the run (and its delivery) now
        return Settle.ACK

    def _context(self, mesh: EngineMesh, work: ChildRunWork, attempt: int) -> RunContext:
        loop = asyncio.get_running_loop()
        consumer = self.consumer
        slot = None
        if consumer is not None:
            slot = SlotLease(
                lend=lambda: loop.call_soon_threadsafe(consumer.lend_slot),
                reclaim=lambda: asyncio.run_coroutine_threadsafe(
                    consumer.reclaim_slot(), loop
                ).result(),
            )
        return RunContext(
            tenant=work.tenant, session=work.session, turn=work.turn, run=work.child_run,
            tree=work.tree, sandbox=work.sandbox, mesh=mesh, depth=work.depth,
            parent_run=work.parent_run, parent_call=work.call_id, context=work.context,
            deadline=work.deadline or None, slot=slot, attempt=attempt,
        )  # fmt: skip

    async def _watch(self, mesh: EngineMesh, work: ChildRunWork, ctx: RunContext) -> Subscription:
        """On the bus loop: the turn's cancel, or its end, stops the child at its next step."""

        async def on_message(msg: Msg) -> None:
            if (msg.headers or {}).get(TYPE_HEADER) not in STOP_TYPES:
                return
            try:
                envelope = await mesh.codec.decode(msg.data, tenant=work.tenant)
            except CodecError:
                return
            if envelope.turn == work.turn and isinstance(envelope.data, STOPS):
                reason = getattr(envelope.data, "reason", "") or "the turn has ended"
                ctx.cancel.set(reason)

        sub = await mesh.bus.nc.subscribe(log_subject(work.tenant, work.session), cb=on_message)
        await mesh.bus.nc.flush(timeout=10)  # held by the server before the log is read
        return sub

    async def _turn_over(self, mesh: EngineMesh, work: ChildRunWork) -> bool:
        log = TurnLog(mesh.store, mesh.codec, mesh.actor)
        state, _ = await mesh.on_bus(log.load(work.tenant, work.session))
        turn = state.turns.get(work.turn)
        return turn is None or turn.ended is not None or turn.cancel_requested

    async def _record_lost(self, mesh: EngineMesh, work: ChildRunWork, head: Head) -> bool:
        """Fenced, not re-decided: appended only if the run is still where its last delivery
        found it; a run that moved has a live holder again, whose delivery this no longer is."""
        envelope = Envelope(
            id=new_id(), tenant=work.tenant, session=work.session, turn=work.turn,
            run=work.child_run, parent_run=work.parent_run, actor=mesh.actor, ts=utc_now(),
            data=child_lost(),
            correlation=work.turn,
        )  # fmt: skip
        subject = run_subject(work.tenant, work.session, work.child_run)
        try:
            await mesh.on_bus(mesh.store.append(subject, envelope, expect=head))
        except AppendConflict:
            return False
        self._log.warning("child run lost with its replica", extra={"run": work.child_run})
        return True

    async def _reap(self, mesh: EngineMesh, work: ChildRunWork) -> None:
        """The child's sandbox goes with its run (a `context` child shares its parent's: its
        context was closed by the run's interpreter)."""
        if work.branch == "context":
            return
        with contextlib.suppress(Exception):  # already gone: nothing to reap
            await in_own_thread(mesh.bus.delete_sandbox, work.sandbox)


async def _unsubscribe(sub: Subscription) -> None:
    with contextlib.suppress(Exception):
        await sub.unsubscribe()


def _task(work: ChildRunWork) -> RlmTask:
    return RlmTask(
        inputs={"task": work.task}, signature=work.signature, max_iters=work.max_iters,
        max_llm_calls=work.max_llm_calls, max_output_chars=work.max_output_chars,
        planner_role=work.planner_role, delegate_role=work.delegate_role,
    )  # fmt: skip
