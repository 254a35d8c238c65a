"""Appending: one event or an atomic batch, after an expected head, recognising lost acks.

The server checks the sequence *before* dedup, so a retry after a lost ack comes back as
"wrong last sequence": the store reads back what follows the expected head and, if it is ours,
reports the append as a duplicate instead of a conflict (`readback`).
"""

import logging
from collections.abc import Sequence
from typing import Any

from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError

from fleet_events import Envelope
from fleet_events.binding import binding_problem
from fleet_events.catalog import type_of
from fleet_events.chain import HASH_HEADER
from fleet_events.envelope import Offloaded
from fleet_mesh.store import readback
from fleet_mesh.store.errors import StoreError, StoreUnavailable, WrongSubject
from fleet_mesh.store.headers import (
    append_headers,
    batch_answer,
    batch_messages,
    committed,
    duplicate_at,
    signed,
)
from fleet_mesh.store.model import Appended, Head
from fleet_mesh.store.reads import Reader, headers_of

log = logging.getLogger("fleet.store")

MAX_BATCH = 1000
APPEND_TRIES = 3


def check_appendable(subject: str, envelope: Envelope[Any]) -> None:
    """Refuse, before anything is sent, an event that does not belong on `subject`."""
    if isinstance(envelope.data, Offloaded):
        raise WrongSubject(
            f"event {envelope.id} is an Offloaded stub: only the codec writes those; append the "
            "full event and the store offloads it when it is large"
        )
    problem = binding_problem(subject, envelope)
    if problem is not None:
        raise WrongSubject(problem)


class Appender(Reader):
    async def append(
        self, subject: str, envelope: Envelope[Any], *, expect: Head | None = None
    ) -> Appended:
        """Append one event after `expect` (default: the subject's current head)."""
        check_appendable(subject, envelope)
        if expect is None:
            expect = await self.head(subject)
        payload = await self._codec.encode(envelope)
        headers = append_headers(envelope.id, expect, payload, type_of(envelope.data))
        headers = signed(subject, headers, self._signer)
        for attempt in range(APPEND_TRIES):
            try:
                ack = await self._js.publish(
                    subject, payload, timeout=self._timeout, stream=self._stream, headers=headers
                )
            except NatsTimeout:
                # The ack may be lost while the write landed: publishing the same bytes again is
                # safe (dedup by id, and the sequence check + read-back below).
                log.warning("append ack timed out", extra={"subject": subject, "try": attempt})
                headers = dict(headers)  # the client writes into the dict it is given
                continue
            except APIError as exc:
                if exc.err_code == readback.WRONG_LAST_SEQUENCE:
                    (appended,) = await self._read_back(subject, [envelope.id], expect, exc)
                    return appended
                raise
            if ack.duplicate:
                msg = await self._js.get_msg(self._stream, ack.seq, direct=True)
                stored_on = msg.subject or ""
                return duplicate_at(
                    subject, envelope.id, self._stream, ack.seq, stored_on, headers_of(msg)
                )
            return Appended(ack.seq, headers[HASH_HEADER])
        raise StoreError(f"append to {subject}: no acknowledgement after {APPEND_TRIES} tries")

    async def append_batch(
        self, subject: str, envelopes: Sequence[Envelope[Any]], *, expect: Head | None = None
    ) -> list[Appended]:
        """Append several events atomically and contiguously: all of them or none."""
        if not envelopes:
            return []
        if len(envelopes) == 1:
            return [await self.append(subject, envelopes[0], expect=expect)]
        if len(envelopes) > MAX_BATCH:
            raise ValueError(f"a batch holds at most {MAX_BATCH} events, got {len(envelopes)}")
        for envelope in envelopes:
            check_appendable(subject, envelope)
        if expect is None:
            expect = await self.head(subject)
        encoded = [(e.id, await self._codec.encode(e), type_of(e.data)) for e in envelopes]
        messages = [
            (payload, signed(subject, headers, self._signer))
            for payload, headers in batch_messages(expect, encoded)
        ]
        for payload, headers in messages[:-1]:
            await self._nc.publish(subject, payload, headers=headers)
        payload, headers = messages[-1]
        try:
            reply = await self._nc.request(subject, payload, headers=headers, timeout=self._timeout)
        except NatsTimeout as exc:
            # Retrying the same call is safe: the read-back recognises a batch that landed.
            raise StoreUnavailable(f"batch append to {subject}: no answer in time") from exc
        last_seq, err_code, description = batch_answer(reply.data)
        if last_seq is not None:
            return committed(last_seq, messages)
        if err_code in readback.RETRIED:
            refused = APIError(err_code=err_code, description=description)
            return await self._read_back(subject, [e.id for e in envelopes], expect, refused)
        raise StoreError(f"batch append to {subject} refused: {description}")

    async def _read_back(
        self, subject: str, ids: list[str], expect: Head, exc: APIError
    ) -> list[Appended]:
        """The append was refused: did an earlier try of it land (its ack lost)? One round trip
        reads the events right after `expect`; `readback.ours` compares them."""
        stored, _ = await self._direct_batch(subject, expect.seq + 1, limit=len(ids))
        found = readback.ours(ids, stored)
        if found is not None:
            return found
        head = await self.head(subject)
        raise readback.refusal(subject, expect.seq, head.seq, exc.err_code, exc.description)
