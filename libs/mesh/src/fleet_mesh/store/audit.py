"""Auditing the log: re-hash every stored message, or export it verbatim for a verifier with
no server (`records.verify_export`)."""

from collections.abc import AsyncIterator

from fleet_events.chain import HASH_HEADER, PREV_HEADER, ChainVerifier
from fleet_mesh.store import records
from fleet_mesh.store.headers import MSG_ID
from fleet_mesh.store.model import Verification
from fleet_mesh.store.reads import Reader


class Auditor(Reader):
    async def verify(self, filter_subject: str, *, from_seq: int = 1) -> Verification:
        """Check every chain under `filter_subject`; name the first bad event."""
        verifier = ChainVerifier(trust_first=from_seq > 1)
        async for raw in self.read_raw(filter_subject, from_seq=from_seq):
            fault = verifier.feed(
                raw.subject,
                raw.seq,
                raw.headers.get(MSG_ID, "?"),
                raw.headers.get(PREV_HEADER),
                raw.headers.get(HASH_HEADER),
                raw.data,
            )
            if fault is not None:
                break
        return Verification(verifier.checked, verifier.fault)

    async def export(self, filter_subject: str) -> AsyncIterator[bytes]:
        """JSON lines carrying the verbatim stored bytes beside their chain hashes."""
        async for raw in self.read_raw(filter_subject):
            yield records.export_line(raw)
