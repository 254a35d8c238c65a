"""The turn work consumer: take a turn, record `TurnStarted`, run it, record how it ended, ack.

The ack comes only after `TurnCompleted`, `TurnFailed` or `TurnCancelled` is stored, so a
replica that dies at any point leaves the work item to be redelivered (`fleet_mesh.work`);
the next holder folds the log and carries on from what it says (`turns.start`). Every append
is made against the head its decision was folded at; when the log moved, the worker folds
again and decides again, which is also how a replica that froze past its ack deadline finds
its turn taken over (`turns.finish` answers `Superseded`: it records nothing and leaves the
delivery, which is no longer its own, untouched).

While a turn runs the worker listens on the session's log subject (core NATS sees every
message the stream stores) for a `CancelRequested` naming it, and reads the log's tail every
`cancel_poll_s` for one the subscription missed; the runner sees the token at its next step
boundary.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from fleet_agent import turns
from fleet_agent.run.failures import turn_failure
from fleet_agent.runners import Answered, CancelToken, Failed, Parked, TurnInput, TurnRunner
from fleet_agent.turn_log import TurnLog
from fleet_events import Event, InvalidId, check_id
from fleet_events.catalog import type_of_class
from fleet_events.chain import TYPE_HEADER
from fleet_events.codec import Codec, CodecError
from fleet_events.session import (
    CancelRequested,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnParked,
    TurnWork,
    log_subject,
)
from fleet_mesh.decider import Contended, Decided
from fleet_mesh.work import Delivery, Retry, Settle

CANCEL = type_of_class(CancelRequested)
STALE_READ_S = 2.0
"""How soon a turn whose request a log read did not hold is delivered again."""
D = TypeVar("D", bound=Decided)


class TurnWorker:
    def __init__(
        self,
        nc: Client,
        log: TurnLog,
        codec: Codec,
        runner: TurnRunner,
        *,
        replica: str,
        max_attempts: int,
        logger: logging.Logger,
        cancel_poll_s: float = 10.0,
        before_ack: Callable[[str, int], Awaitable[None]] | None = None,
    ) -> None:
        self._nc = nc
        self._log = log
        self._codec = codec
        self._runner = runner
        self._replica = replica
        self._max_attempts = max_attempts
        self._logger = logger
        self._cancel_poll_s = cancel_poll_s
        self._before_ack = before_ack
        """A test's barrier between a turn's stored end and its ack (`fleet_harness`)."""
        self._decode = msgspec.json.Decoder(TurnWork).decode

    async def handle(self, delivery: Delivery) -> Settle | Retry:
        try:
            work = self._decode(delivery.data)
            for kind, value in (("tenant", work.tenant), ("session", work.session)):
                check_id(kind, value)
            check_id("turn", work.turn)
        except (msgspec.DecodeError, InvalidId) as exc:
            self._logger.error("malformed turn work item: dropped", extra={"why": str(exc)})
            return Settle.TERM
        token = CancelToken()
        sub = await self._watch_cancels(work, token)
        poll = asyncio.create_task(self._poll_cancels(work, token))
        try:
            return await self._take(work, delivery, token)
        finally:
            poll.cancel()
            await sub.unsubscribe()

    async def _watch_cancels(self, work: TurnWork, token: CancelToken) -> Subscription:
        """Listen before folding, so a cancel stored between the fold and the run is seen
        either in the fold or here. `subscribe` returns once the SUB is queued, not once the
        server holds the interest: the flush waits for that, so the fold that follows reads
        the log from a position no later than the one the subscription hears from (a cancel
        stored in between is in the fold, or refuses the `TurnStarted` append that expects
        the folded head, and the refold has it)."""

        async def on_message(msg: Msg) -> None:
            if (msg.headers or {}).get(TYPE_HEADER) != CANCEL:
                return
            try:
                envelope = await self._codec.decode(msg.data, tenant=work.tenant)
            except CodecError:
                return
            if envelope.turn == work.turn and isinstance(envelope.data, CancelRequested):
                token.cancel(envelope.data.reason)

        sub = await self._nc.subscribe(log_subject(work.tenant, work.session), cb=on_message)
        try:
            await self._nc.flush()
        except BaseException:
            await sub.unsubscribe()
            raise
        return sub

    async def _poll_cancels(self, work: TurnWork, token: CancelToken) -> None:
        """The core subscription misses what is stored while the connection is down: every
        `cancel_poll_s` the log's tail (one round trip, the fold is kept) is read as well."""
        while not token.cancelled:
            await asyncio.sleep(self._cancel_poll_s)
            try:
                state, _ = await self._log.load(work.tenant, work.session)
            except Exception:
                self._logger.warning("cancel poll failed", exc_info=True)
                continue
            record = state.turns.get(work.turn)
            if record is not None and record.cancel_requested:
                token.cancel(record.cancel_reason)

    async def _take(self, work: TurnWork, delivery: Delivery, token: CancelToken) -> Settle | Retry:
        unseen = False

        def decide(state: turns.SessionTurns) -> turns.Start | turns.End | turns.Drop:
            nonlocal unseen
            unseen = work.turn not in state.turns
            return turns.start(
                state, work.turn, delivery=delivery.attempt, max_attempts=self._max_attempts,
                replica=self._replica, restartable=self._runner.restartable,
            )  # fmt: skip

        decision = await self._decide(work, decide)
        if decision is None:
            return Settle.NAK  # a very busy log: let the next delivery try again
        if isinstance(decision, turns.Drop) and unseen and delivery.attempt < self._max_attempts:
            # The dispatcher saw this turn's request stored, so a log read without it is a
            # stale one: in a cluster, a replica still catching up answers direct gets (a
            # node restarted after its leader was killed). Dropping it would lose the turn.
            self._logger.warning(
                "the log read does not hold this turn's request yet: delivered again",
                extra={"turn": work.turn, "requested_seq": work.requested_seq},
            )
            return Retry(STALE_READ_S)
        if isinstance(decision, turns.Drop):
            self._logger.info("turn not run", extra={"turn": work.turn, "why": decision.why})
            return Settle.ACK
        if isinstance(decision, turns.End):
            return Settle.ACK
        return await self._run(work, decision, token)

    async def _decide(self, work: TurnWork, decide: Callable[[turns.SessionTurns], D]) -> D | None:
        """The decision on the log read to its head, once what it stores is stored (a lost
        race decides again); None when the log kept moving under every attempt."""
        try:
            return await self._log.submit(
                work.tenant, work.session, decide, about=lambda _: (work.turn, None)
            )
        except Contended:
            return None

    async def _run(self, work: TurnWork, start: turns.Start, token: CancelToken) -> Settle:
        attempt = start.event.attempt
        requested = await self._log.requested(work.tenant, work.session, start.message_seq)
        turn = TurnInput(
            tenant=work.tenant, session=work.session, turn=work.turn,
            message=requested.data.message, attempt=attempt, replica=self._replica,
        )  # fmt: skip
        ended = await self._outcome(turn, token)
        decision = await self._decide(
            work, lambda state: turns.finish(state, work.turn, attempt=attempt, event=ended)
        )
        if decision is None:
            return Settle.NAK
        if isinstance(decision, turns.Superseded):
            self._logger.warning(
                "turn superseded: not recorded",
                extra={"turn": work.turn, "attempt": attempt, "why": decision.why},
            )
            return Settle.LEAVE
        if self._before_ack is not None:
            await self._before_ack(work.turn, attempt)
        return Settle.ACK

    async def _outcome(self, turn: TurnInput, token: CancelToken) -> Event:
        try:
            result = await self._runner.run(turn, token)
        except Exception as exc:
            # The traceback stays in this replica's log; the event says what and where to
            # look, never the exception's text (it may hold anything, secrets included),
            # unless the exception states a failure (`run.failures`).
            self._logger.exception("turn runner failed", extra={"turn": turn.turn})
            failed = turn_failure(exc, turn.replica)
            return TurnFailed(
                error=failed.error, retryable=failed.retryable, code=failed.code,
                attempt=turn.attempt,
            )  # fmt: skip
        if isinstance(result, Failed):
            return TurnFailed(
                error=result.error, retryable=result.retryable, code=result.code,
                attempt=turn.attempt,
            )  # fmt: skip
        if isinstance(result, Parked):
            return TurnParked(request_id=result.request_id, attempt=turn.attempt)
        if isinstance(result, Answered):
            return TurnCompleted(
                answer=result.answer, root_head_hash=result.root_head_hash,
                answered_by=result.answered_by, fallback=result.fallback,
            )  # fmt: skip
        return TurnCancelled(reason=token.reason, partial=result.partial, attempt=turn.attempt)
