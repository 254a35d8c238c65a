"""The hash chain: `hash = sha256(prev_hash || stored bytes)`, one chain per subject.

Computed over the exact bytes stored, never over a re-encoding, so an old log still verifies
after an event type gains a defaulted field. Pure: the store and `fleet audit verify` share it.
"""

import hashlib
import re
from dataclasses import dataclass, field

import msgspec

from fleet_events.binding import binding_problem
from fleet_events.signing import CheckpointIndex, KeySet

GENESIS = "0" * 64

HASH_HEADER = "Fleet-Hash"
PREV_HEADER = "Fleet-Prev"
TYPE_HEADER = "Fleet-Type"


_HEX64 = re.compile(r"[0-9a-f]{64}")


class _Names(msgspec.Struct, frozen=True):
    """An envelope's names, read from stored bytes without knowing its event type."""

    id: str
    tenant: str
    session: str | None = None
    run: str | None = None


_names = msgspec.json.Decoder(_Names)


def link(prev_hash: str, payload: bytes | memoryview) -> str:
    digest = hashlib.sha256(bytes.fromhex(prev_hash))
    digest.update(payload)
    return digest.hexdigest()


@dataclass(frozen=True)
class ChainFault:
    subject: str
    seq: int
    event_id: str
    reason: str

    def __str__(self) -> str:
        return f"event {self.event_id} (seq {self.seq} on {self.subject}): {self.reason}"


@dataclass
class ChainVerifier:
    """Feed stored events in stream order; the first fault is kept and reported.

    Starting mid-log (`trust_first=True`), a subject's first `prev` is taken on trust;
    from the beginning, every chain must start at GENESIS. With pinned `keys`, every event's
    signature is checked too (`KeySet.append_problem`); with `checkpoints`, every event the
    checkpointer pinned must be there with the pinned hash (`finish` reports the ones missing).
    """

    trust_first: bool = False
    keys: KeySet | None = None
    checkpoints: CheckpointIndex | None = None
    seen: dict[str, set[int]] = field(default_factory=dict)
    heads: dict[str, str] = field(default_factory=dict)
    checked: int = 0
    last_seq: int = 0
    fault: ChainFault | None = None

    def feed(
        self,
        subject: str,
        seq: int,
        event_id: str,
        prev: str | None,
        claimed: str | None,
        payload: bytes | memoryview,
        key_id: str | None = None,
        sig: str | None = None,
    ) -> ChainFault | None:
        if self.fault is not None:
            return self.fault
        expected_prev = self.heads.get(subject)
        if expected_prev is None and not self.trust_first:
            expected_prev = GENESIS
        problem = self._problem(subject, seq, event_id, prev, claimed, expected_prev, payload)
        if problem is None and self.keys is not None:
            assert claimed is not None
            problem = self.keys.append_problem(subject, claimed, key_id, sig)
        if problem is None and self.checkpoints is not None:
            assert claimed is not None
            problem = self.checkpoints.event_problem(subject, seq, claimed)
            self.seen.setdefault(subject, set()).add(seq)
        self.checked += 1
        if problem is not None:
            self.fault = ChainFault(subject, seq, event_id, problem)
            return self.fault
        assert claimed is not None
        self.heads[subject] = claimed
        self.last_seq = seq
        return None

    def finish(self, *, all_pinned: bool = False) -> ChainFault | None:
        """After the last event: a checkpointed event that is no longer there (a
        purge-and-rewrite keeps the chain whole, but not the pinned sequences), on the subjects
        seen or, with `all_pinned` (the index was cut to the filter read), on every subject."""
        if self.fault is None and self.checkpoints is not None:
            subjects = self.checkpoints.pinned.keys() if all_pinned else self.seen.keys()
            gone = self.checkpoints.missing(self.seen, subjects)
            if gone is not None:
                subject, seq, problem = gone
                self.fault = ChainFault(subject, seq, "?", problem)
        return self.fault

    def _problem(
        self,
        subject: str,
        seq: int,
        event_id: str,
        prev: str | None,
        claimed: str | None,
        expected_prev: str | None,
        payload: bytes | memoryview,
    ) -> str | None:
        if prev is None or claimed is None:
            return "no chain headers"
        if _HEX64.fullmatch(prev) is None or _HEX64.fullmatch(claimed) is None:
            return "malformed chain headers (expected 64 lowercase hex digits)"
        if seq <= self.last_seq:
            return f"out of stream order (sequence {seq} after {self.last_seq})"
        if expected_prev is not None and prev != expected_prev:
            return f"prev hash {prev[:12]}… does not follow the chain head {expected_prev[:12]}…"
        if link(prev, payload) != claimed:
            return "stored bytes do not match the event's hash (altered payload)"
        try:
            names = _names.decode(payload)
        except msgspec.DecodeError:
            return "stored bytes are not an event envelope"
        if names.id != event_id:
            return f"stored under id {event_id} but the event inside is {names.id}"
        return binding_problem(subject, names)
