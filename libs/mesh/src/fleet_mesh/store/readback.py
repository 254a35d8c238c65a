"""After a refused append: were the events ours all along (an earlier try whose ack was lost)?

The server could only have stored our events right after `expect`, so the subject's first events
after `expect.seq` are compared with our ids, every one and in order: another writer appending
after ours, or storing just one of our ids (a retried request), cannot make the answer wrong.
"""

from collections.abc import Sequence

from fleet_events.chain import HASH_HEADER
from fleet_mesh.store.errors import AppendConflict, DuplicateInBatch
from fleet_mesh.store.headers import MSG_ID
from fleet_mesh.store.model import Appended, RawEvent

WRONG_LAST_SEQUENCE = 10071
BATCH_DUPLICATE_ID = 10201
RETRIED = (WRONG_LAST_SEQUENCE, BATCH_DUPLICATE_ID)
"""Refusals that an earlier, landed try of the same append would cause."""


def ours(ids: Sequence[str], stored: Sequence[RawEvent]) -> list[Appended] | None:
    """Our events as stored, when the events after `expect` are exactly ours; else None."""
    if [raw.headers.get(MSG_ID) for raw in stored] != list(ids):
        return None
    return [Appended(raw.seq, raw.headers.get(HASH_HEADER, ""), duplicate=True) for raw in stored]


def refusal(
    subject: str, expected: int, actual: int, err_code: int | None, detail: str | None
) -> AppendConflict:
    """Not ours: a conflict to reload on, unless reloading cannot help (a reused id in a batch
    on a subject that did not move)."""
    detail = detail or "wrong last sequence"
    if err_code == BATCH_DUPLICATE_ID and actual == expected:
        return DuplicateInBatch(subject, expected, detail, actual=actual)
    return AppendConflict(subject, expected, detail, actual=actual)
