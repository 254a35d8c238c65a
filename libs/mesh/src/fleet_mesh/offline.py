"""The offline check of an export's event lines, with no server and no NATS client: the rule
`fleet_mesh.store.records.verify_export` applies, in a module a verifier can import without
the store package (whose import pulls in nats-py, a third of a second at the terminal:
`fleet audit verify` imports only this, `fleet_events.chain` and `fleet_events.signing`).

Pure: bytes in, (events checked, the first fault or None) out.
"""

import base64
import json
from collections.abc import Iterable, Sequence

from fleet_events.chain import ChainFault, ChainVerifier
from fleet_events.signing import (
    KEYSET_KIND,
    Checkpoint,
    CheckpointIndex,
    KeySet,
    SigningError,
    checkpoint_chain_problem,
)


def check_lines(
    lines: Iterable[bytes],
    *,
    keys: KeySet | None = None,
    checkpoints: Sequence[Checkpoint] = (),
    within: str | None = None,
) -> tuple[int, ChainFault | None]:
    """(events checked, the first fault): every chain over the exported bytes; with `keys`,
    every signature; with `checkpoints` (signed by a pinned checkpoint key), every pinned head,
    and with `within` a pinned subject missing from the lines is a fault too. The export's own
    key-set line is skipped: the verifier checks against the keys it is given, never those the
    file brings."""
    fault = checkpoint_fault(checkpoints, keys)
    if fault is not None:
        return 0, fault
    pinned = CheckpointIndex.of(checkpoints, within) if checkpoints else None
    verifier = ChainVerifier(keys=keys, checkpoints=pinned)
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            if row.get("kind") == KEYSET_KIND:
                continue
            payload = base64.b64decode(row["payload"], validate=True)
            subject, seq, event_id = str(row["subject"]), int(row["seq"]), str(row["id"])
            prev, claimed = row.get("prev"), row.get("hash")
            key_id, sig = row.get("key"), row.get("sig")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            fault = ChainFault("?", -1, "?", f"export line {number} is unreadable: {exc!r}")
            return verifier.checked, fault
        if verifier.feed(subject, seq, event_id, prev, claimed, payload, key_id, sig):
            break
    return verifier.checked, verifier.finish(all_pinned=within is not None)


def exported_keys(lines: Iterable[bytes]) -> KeySet | None:
    """The key set an export says it was signed with (to show, or to pin once after comparing
    it with the deployment's), or None."""
    for line in lines:
        row = json.loads(line)
        if isinstance(row, dict) and row.get("kind") == KEYSET_KIND:
            return KeySet.from_json(row)
    return None


def checkpoint_fault(checkpoints: Sequence[Checkpoint], keys: KeySet | None) -> ChainFault | None:
    """Why `checkpoints` cannot be used (unsigned by a pinned checkpoint key, or their chain
    broken), or None; the store's `verify` applies the same rule on the server."""
    if not checkpoints:
        return None
    if keys is None:
        return ChainFault("?", -1, "?", "checkpoints given without pinned keys to check them")
    try:
        problem = checkpoint_chain_problem(checkpoints, keys)
    except SigningError as exc:
        problem = str(exc)
    return None if problem is None else ChainFault("?", -1, "?", f"checkpoints: {problem}")
