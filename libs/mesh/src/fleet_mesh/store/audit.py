"""Auditing the log: re-hash (and, with pinned keys, check the signature of) every stored
message, or export it verbatim for a verifier with no server (`records.verify_export`)."""

from collections.abc import AsyncIterator, Sequence

from fleet_events.chain import HASH_HEADER, PREV_HEADER, ChainVerifier
from fleet_events.signing import KEY_HEADER, SIG_HEADER, Checkpoint, CheckpointIndex, KeySet
from fleet_mesh import offline
from fleet_mesh.store import records
from fleet_mesh.store.headers import MSG_ID
from fleet_mesh.store.model import Verification
from fleet_mesh.store.reads import Reader


class Auditor(Reader):
    async def verify(
        self,
        filter_subject: str,
        *,
        from_seq: int = 1,
        keys: KeySet | None = None,
        checkpoints: Sequence[Checkpoint] = (),
    ) -> Verification:
        """Check every chain under `filter_subject`; name the first bad event. With `keys`,
        signatures too; with `checkpoints`, the heads they pin (`records.verify_export`)."""
        fault = offline.checkpoint_fault(checkpoints, keys)
        if fault is not None:
            return Verification(0, fault)
        verifier = ChainVerifier(
            trust_first=from_seq > 1,
            keys=keys,
            checkpoints=CheckpointIndex.of(checkpoints, filter_subject) if checkpoints else None,
        )
        async for raw in self.read_raw(filter_subject, from_seq=from_seq):
            fault = verifier.feed(
                raw.subject,
                raw.seq,
                raw.headers.get(MSG_ID, "?"),
                raw.headers.get(PREV_HEADER),
                raw.headers.get(HASH_HEADER),
                raw.data,
                raw.headers.get(KEY_HEADER),
                raw.headers.get(SIG_HEADER),
            )
            if fault is not None:
                break
        return Verification(verifier.checked, verifier.finish(all_pinned=from_seq == 1))

    async def export(
        self, filter_subject: str, *, keys: KeySet | None = None
    ) -> AsyncIterator[bytes]:
        """JSON lines carrying the verbatim stored bytes beside their chain hashes and
        signatures, after a first line naming the key set (`keys`) when one is given."""
        if keys is not None:
            yield records.keyset_line(keys)
        async for raw in self.read_raw(filter_subject):
            yield records.export_line(raw)
