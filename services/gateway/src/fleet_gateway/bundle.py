"""A session export as one self-standing JSON-lines file, and its check with no server.

Event lines are the event store's own export lines (`fleet_mesh.store.records.export_line`:
subject, sequence, id, chain links and the verbatim stored bytes in base64), so the chain is
checked over exactly the bytes that were stored. After them come the payloads those events
reference in the object store (offloaded envelopes, documents, big cell outputs), one
`{"kind":"blob",...}` line each, so the export verifies and replays on its own: every blob a
stored event names must be in the file with the digest it is named by.

Pure: no I/O, so the import route, `fleet audit verify` and the tests share one rule.
"""

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleet_events import subjects
from fleet_events.chain import ChainFault
from fleet_events.signing import KeySet
from fleet_mesh.store import Verification, verify_export

BLOB_KIND = "blob"


@dataclass(frozen=True, slots=True)
class EventRow:
    subject: str
    seq: int
    id: str
    hash: str
    payload: bytes


@dataclass(slots=True)
class Bundle:
    events: list[EventRow] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)
    """sha256 → bytes."""
    verification: Verification = field(default_factory=lambda: Verification(0, None))

    @property
    def ok(self) -> bool:
        return self.verification.ok


def blob_refs(value: Any) -> Iterator[tuple[str, str, int]]:
    """Every `{object, sha256, size}` (a `BlobRef`) anywhere inside decoded JSON."""
    if isinstance(value, dict):
        sha, obj, size = value.get("sha256"), value.get("object"), value.get("size")
        if isinstance(sha, str) and isinstance(obj, str) and isinstance(size, int):
            yield obj, sha, size
        for item in value.values():
            yield from blob_refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from blob_refs(item)


def payload_refs(payload: bytes) -> list[tuple[str, str, int]]:
    try:
        return list(blob_refs(json.loads(payload)))
    except ValueError:
        return []


def blob_line(obj: str, sha256: str, data: bytes) -> bytes:
    body = {"kind": BLOB_KIND, "object": obj, "sha256": sha256, "size": len(data),
            "data": base64.b64encode(data).decode()}  # fmt: skip
    return json.dumps(body, separators=(",", ":")).encode()


def _fault(row: EventRow | None, reason: str, checked: int) -> Verification:
    if row is None:
        return Verification(checked, ChainFault("?", -1, "?", reason))
    return Verification(checked, ChainFault(row.subject, row.seq, row.id, reason))


def read_bundle(lines: Iterable[bytes], *, keys: KeySet | None = None) -> Bundle:
    """Parse and verify: the chains (the store's rule), with `keys` every signature too, one
    session only, and every blob an event names present with its digest. `verification`
    names the first fault."""
    bundle = Bundle()
    event_lines: list[bytes] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if row.get("kind") == BLOB_KIND:
                data = base64.b64decode(row["data"], validate=True)
                sha = str(row["sha256"])
                if hashlib.sha256(data).hexdigest() != sha:
                    bundle.verification = _fault(
                        None, f"blob line {number} does not match its sha256 {sha[:16]}…", 0
                    )
                    return bundle
                bundle.blobs[sha] = data
                continue
            if "kind" in row:  # another record of the export (a signing key set): the store's
                event_lines.append(line)  # verifier reads it, it is not an event
                continue
            bundle.events.append(
                EventRow(
                    str(row["subject"]), int(row["seq"]), str(row["id"]), str(row.get("hash")),
                    base64.b64decode(row["payload"], validate=True),
                )
            )  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            bundle.verification = _fault(None, f"export line {number} is unreadable: {exc!r}", 0)
            return bundle
        event_lines.append(line)
    chain = verify_export(event_lines, keys=keys)
    if not chain.ok:
        bundle.verification = chain
        return bundle
    if not bundle.events:
        bundle.verification = _fault(None, "the export holds no event", 0)
        return bundle
    first = subjects.parse_session(bundle.events[0].subject)
    for row in bundle.events:
        where = subjects.parse_session(row.subject)
        if first is None or where is None or where.scope != first.scope:
            scope = first.scope if first is not None else "one session's"
            bundle.verification = _fault(
                row, f"belongs to another session than {scope}", chain.checked
            )
            return bundle
        for _, sha, _ in payload_refs(row.payload):
            if sha not in bundle.blobs:
                bundle.verification = _fault(
                    row, f"names blob {sha[:16]}… that the export does not carry", chain.checked
                )
                return bundle
            for _, inner, _ in payload_refs(bundle.blobs[sha]):  # an offloaded envelope's own
                if inner not in bundle.blobs:
                    bundle.verification = _fault(
                        row, f"names blob {inner[:16]}… that the export does not carry",
                        chain.checked,
                    )  # fmt: skip
                    return bundle
    bundle.verification = chain
    return bundle
