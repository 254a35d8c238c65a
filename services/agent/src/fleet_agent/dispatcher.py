"""The dispatcher: every `TurnRequested` on any session's `.log` becomes a turn work item.

It is a shared durable consumer on the SESSIONS stream (`streams.TURN_DISPATCH`), run by every
agent replica, so a gateway that dies right after its append still gets the turn run, and any
replica may dispatch. The log message is acked only after the work item's publish is acked;
a redelivered log message publishes again under the same `Nats-Msg-Id`, which the WORK stream
deduplicates, and once the turn has started the fold says so and nothing is published.

Tenant and session come from the subject the request is stored on (the store bound the
envelope to it), never from what the payload claims.
"""

import dataclasses
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
from fleet_mesh.decider import Contended
from fleet_mesh.work import Delivery, Settle

REQUESTED = type_of_class(TurnRequested)
RESUMES = frozenset(
    type_of_class(cls) for cls in (InputProvided, InputExpired, CancelRequested, TurnParked)
)
"""Facts that may let a parked turn go on (its answer, expiry or cancel; or the park itself,
stored after an answer that came first)."""


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
        seq = delivery.stream_seq
        chosen: list[turns.Turn] = []  # the turn of the decision answered (the last decide)

        def decide(state: turns.SessionTurns) -> turns.Dispatch | turns.Refuse | turns.Nothing:
            chosen.clear()
            turn = _turn_at(state, seq)
            if turn is None:
                return turns.Nothing("no turn was requested at this position")
            chosen.append(dataclasses.replace(turn))  # a copy: the fold goes on mutating
            return turns.dispatch(state, turn.turn)

        def about(_: turns.SessionTurns) -> tuple[str, str | None]:
            return chosen[0].turn, chosen[0].request_id

        try:
            decision = await self._log.submit(tenant, session, decide, about=about)
        except Contended:
            return Settle.NAK  # a very busy log: let the next delivery try again
        if isinstance(decision, turns.Dispatch):
            await self._publish(tenant, session, chosen[0])
        elif isinstance(decision, turns.Refuse):
            self._logger.info(
                "turn refused",
                extra={"turn": chosen[0].turn, "reason": decision.event.reason, "tenant": tenant},
            )
        return Settle.ACK

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
