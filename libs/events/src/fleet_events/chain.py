"""The hash chain: `hash = sha256(prev_hash || stored bytes)`, one chain per subject.

Computed over the exact bytes stored, never over a re-encoding, so an old log still verifies
after an event type gains a defaulted field. Pure: the store and `fleet audit verify` share it.
"""

import hashlib
from dataclasses import dataclass, field

GENESIS = "0" * 64

HASH_HEADER = "Fleet-Hash"
PREV_HEADER = "Fleet-Prev"
TYPE_HEADER = "Fleet-Type"


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
    from the beginning, every chain must start at GENESIS.
    """

    trust_first: bool = False
    heads: dict[str, str] = field(default_factory=dict)
    checked: int = 0
    fault: ChainFault | None = None

    def feed(
        self,
        subject: str,
        seq: int,
        event_id: str,
        prev: str | None,
        claimed: str | None,
        payload: bytes | memoryview,
    ) -> ChainFault | None:
        if self.fault is not None:
            return self.fault
        expected_prev = self.heads.get(subject)
        if expected_prev is None and not self.trust_first:
            expected_prev = GENESIS
        problem = None
        if prev is None or claimed is None:
            problem = "no chain headers"
        elif expected_prev is not None and prev != expected_prev:
            problem = f"prev hash {prev[:12]}… does not follow the chain head {expected_prev[:12]}…"
        elif link(prev, payload) != claimed:
            problem = "stored bytes do not match the event's hash (altered payload)"
        self.checked += 1
        if problem is not None:
            self.fault = ChainFault(subject, seq, event_id, problem)
            return self.fault
        assert claimed is not None
        self.heads[subject] = claimed
        return None
