"""The dispatcher: every `TurnRequested` on any session's `.log` becomes a turn work item.

It is a shared durable consumer on the SESSIONS stream (`streams.TURN_DISPATCH`), run by every
agent replica, so a gateway that dies right after its append still gets the turn run, and any
replica may dispatch. The log message is acked only after the work item's publish is acked;
a redelivered log message publishes again under the same `Nats-Msg-Id`, which the WORK stream
deduplicates, and once the turn has started the fold says so and nothing is published.

Tenant and session come from the subject the request is stored on (the store bound the
envelope to it), never from what the payload claims.
"""

import logging

import msgspec
from nats.js import JetStreamContext

from fleet_agent import turns
from fleet_agent.turn_log import TurnLog
from fleet_events.binding import session_tokens, subject_tenant
from fleet_events.catalog import type_of_class
from fleet_events.chain import TYPE_HEADER
from fleet_events.session import (
    TURN_WORK_SUBJECT,
    CancelRequested,
    InputExpired,
    InputProvided,
    TurnParked,
    TurnRequested,
    TurnWork,
    turn_resume_id,
    turn_work_id,
)
from fleet_events.streams import WORK
from fleet_mesh.store import AppendConflict
from fleet_mesh.work import Delivery, Settle

REQUESTED = type_of_class(TurnRequested)
RESUMES = frozenset(
    type_of_class(cls) for cls in (InputProvided, InputExpired, CancelRequested, TurnParked)
)
"""Facts that may let a parked turn go on (its answer, expiry or cancel; or the park itself,
stored after an answer that came first)."""
CONFLICT_TRIES = 16


class Dispatcher:
    def __init__(self, js: JetStreamContext, log: TurnLog, logger: logging.Logger) -> None:
        self._js = js
        self._log = log
        self._logger = logger
        self._encode = msgspec.json.Encoder().encode

    async def handle(self, delivery: Delivery) -> Settle:
        kind = delivery.headers.get(TYPE_HEADER)
        if kind != REQUESTED and kind not in RESUMES:
            return Settle.ACK  # any other fact of the log: nothing to dispatch
        tenant = subject_tenant(delivery.subject)
        tokens = session_tokens(delivery.subject)
        if tenant is None or tokens is None:
            return Settle.TERM
        session = tokens[0]
        if kind in RESUMES:
            state, _ = await self._log.load(tenant, session)
            for parked in turns.resumable(state):
                await self._publish(tenant, session, parked, resume=parked.parked_on)
            return Settle.ACK
        for _ in range(CONFLICT_TRIES):
            state, head = await self._log.load(tenant, session)
            turn = _turn_at(state, delivery.stream_seq)
            if turn is None:
                return Settle.ACK
            decision = turns.dispatch(state, turn.turn)
            if isinstance(decision, turns.Nothing):
                return Settle.ACK
            if isinstance(decision, turns.Dispatch):
                await self._publish(tenant, session, turn)
                return Settle.ACK
            try:
                await self._log.append(
                    tenant, session, turn.turn, decision.event,
                    expect=head, causation=turn.request_id,
                )  # fmt: skip
            except AppendConflict:
                continue  # the log moved: fold again, decide again
            self._logger.info(
                "turn refused",
                extra={"turn": turn.turn, "reason": decision.event.reason, "tenant": tenant},
            )
            return Settle.ACK
        return Settle.NAK  # a very busy log: let the next delivery try again

    async def _publish(
        self, tenant: str, session: str, turn: turns.Turn, *, resume: str = ""
    ) -> None:
        work = TurnWork(
            tenant=tenant, session=session, turn=turn.turn, requested_seq=turn.requested_seq
        )
        msg_id = (
            turn_resume_id(tenant, session, turn.turn, resume)
            if resume
            else turn_work_id(tenant, session, turn.turn)
        )
        await self._js.publish(
            TURN_WORK_SUBJECT, self._encode(work), stream=WORK.name, headers={"Nats-Msg-Id": msg_id}
        )


def _turn_at(state: turns.SessionTurns, seq: int) -> turns.Turn | None:
    """The turn whose request is stored at `seq` (a repeated request for a turn maps to none)."""
    for turn in state.turns.values():
        if turn.requested_seq == seq:
            return turn
    return None
