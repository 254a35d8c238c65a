"""Records the store writes beside the log, as pure functions: snapshots and exports.

A snapshot is only a shortcut: one written by another fold version, or one the log no longer
reaches (its subject purged), must be ignored rather than trusted. An export carries the
verbatim stored bytes, so it verifies with no server and no decoding of event types.
"""

import base64
import json
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from fleet_events.chain import HASH_HEADER, PREV_HEADER
from fleet_events.signing import KEY_HEADER, SIG_HEADER, Checkpoint, KeySet
from fleet_mesh.offline import check_lines
from fleet_mesh.offline import exported_keys as exported_keys  # where callers found it
from fleet_mesh.store.headers import MSG_ID
from fleet_mesh.store.model import Head, Loaded, RawEvent, Verification


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    fold: str
    version: int
    seq: int
    heads: dict[str, tuple[int, str]]
    state: msgspec.Raw


def snapshot_key(fold: str, filter_subject: str) -> str:
    """The KV key of a fold's snapshot of a subject or wildcard.

    '=' is allowed in KV keys and never in an id, so a wildcard cannot collide with an id.
    """
    return f"{fold}.{filter_subject.replace('>', '=all').replace('*', '=any')}"


def snapshot_of(fold: str, version: int, loaded: Loaded[Any], state: bytes) -> Snapshot:
    heads = {subject: (h.seq, h.hash) for subject, h in loaded.heads.items()}
    return Snapshot(
        fold=fold, version=version, seq=loaded.seq, heads=heads, state=msgspec.Raw(state)
    )


def unusable(snap: Snapshot, fold: str, version: int, last_seq: int) -> str | None:
    """Why a stored snapshot must not stand for the log (None: it may)."""
    if snap.fold != fold or snap.version != version:
        return "another fold version"
    if last_seq < snap.seq:
        return "beyond the log"
    return None


def loaded_from(snap: Snapshot, state: Any) -> Loaded[Any]:
    heads = {subject: Head(seq, digest) for subject, (seq, digest) in snap.heads.items()}
    return Loaded(state, seq=snap.seq, heads=heads, from_snapshot=True)


def export_line(raw: RawEvent) -> bytes:
    row = {
        "subject": raw.subject,
        "seq": raw.seq,
        "id": raw.headers.get(MSG_ID),
        "prev": raw.headers.get(PREV_HEADER),
        "hash": raw.headers.get(HASH_HEADER),
        "payload": base64.b64encode(raw.data).decode(),
    }
    if KEY_HEADER in raw.headers or SIG_HEADER in raw.headers:  # unsigned lines keep their shape
        row["key"] = raw.headers.get(KEY_HEADER)
        row["sig"] = raw.headers.get(SIG_HEADER)
    return json.dumps(row, separators=(",", ":")).encode()


def keyset_line(keys: KeySet) -> bytes:
    """The export's first line: the public keys its events claim, with their owners. Shown to
    the auditor, never trusted by the verifier, which checks against the keys it pins."""
    return json.dumps(keys.to_json(), separators=(",", ":")).encode()


def verify_export(
    lines: Iterable[bytes],
    *,
    keys: KeySet | None = None,
    checkpoints: Sequence[Checkpoint] = (),
    within: str | None = None,
) -> Verification:
    """Verify an export on its own, with no server: the same chain rule over the same bytes,
    and, with pinned `keys`, every signature; with `checkpoints` (signed by a pinned
    checkpoint key), every pinned head: with `within` (the filter the export was cut with),
    a pinned subject missing from the export is a fault too. Without `keys` only the chain is
    checked, which anyone able to write the file can recompute: an auditor pins keys. The rule
    itself is `fleet_mesh.offline.check_lines` (importable without NATS)."""
    checked, fault = check_lines(lines, keys=keys, checkpoints=checkpoints, within=within)
    return Verification(checked, fault)
