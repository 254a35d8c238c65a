"""Records the store writes beside the log, as pure functions: snapshots and exports.

A snapshot is only a shortcut: one written by another fold version, or one the log no longer
reaches (its subject purged), must be ignored rather than trusted. An export carries the
verbatim stored bytes, so it verifies with no server and no decoding of event types.
"""

import base64
import json
from collections.abc import Iterable
from typing import Any

import msgspec

from fleet_events.chain import HASH_HEADER, PREV_HEADER, ChainFault, ChainVerifier
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
    return json.dumps(
        {
            "subject": raw.subject,
            "seq": raw.seq,
            "id": raw.headers.get(MSG_ID),
            "prev": raw.headers.get(PREV_HEADER),
            "hash": raw.headers.get(HASH_HEADER),
            "payload": base64.b64encode(raw.data).decode(),
        },
        separators=(",", ":"),
    ).encode()


def verify_export(lines: Iterable[bytes]) -> Verification:
    """Verify an export on its own, with no server: the same chain rule over the same bytes."""
    verifier = ChainVerifier()
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            payload = base64.b64decode(row["payload"], validate=True)
            subject, seq, event_id = str(row["subject"]), int(row["seq"]), str(row["id"])
            prev, claimed = row.get("prev"), row.get("hash")
        except (ValueError, KeyError, TypeError) as exc:
            fault = ChainFault("?", -1, "?", f"export line {number} is unreadable: {exc!r}")
            return Verification(verifier.checked, fault)
        if verifier.feed(subject, seq, event_id, prev, claimed, payload):
            break
    return Verification(verifier.checked, verifier.fault)
