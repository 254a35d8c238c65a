"""A session export as one self-standing JSON-lines file, and its one check with no server.

Lines, in order: the key set the export claims (`{"kind":"fleet-keyset"}`: shown, never
trusted), the event lines (`records.export_line`: subject, sequence, id, chain links, the
verbatim stored bytes in base64, `key`/`sig`), the payloads those events reference in the
object store (offloaded envelopes, documents, big cell outputs) as `{"kind":"blob"}` lines, and
last the signed seal (`fleet_events.seal`) naming every subject's head, the number of events
and every blob. So the export verifies and replays on its own.

`read_bundle` is the rule, and the only one: the gateway's import, `fleet audit verify` and
`fleet replay` apply it, so what the auditor's verify refuses the import refuses too. It
imports nothing from NATS (an offline verifier pays for no client).
"""

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet_events import subjects
from fleet_events.chain import ChainFault, ChainVerifier
from fleet_events.seal import SEAL_KIND, Seal, unsigned_seal
from fleet_events.signing import (
    KEYSET_KIND,
    Checkpoint,
    CheckpointIndex,
    KeySet,
    Signer,
    SigningError,
)
from fleet_mesh.offline import checkpoint_fault

BLOB_KIND = "blob"


@dataclass(frozen=True, slots=True)
class EventRow:
    subject: str
    seq: int
    id: str
    prev: str | None
    hash: str
    payload: bytes
    key: str | None = None
    sig: str | None = None


@dataclass(slots=True)
class Bundle:
    events: list[EventRow] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)
    """sha256 → bytes."""
    seal: Seal | None = None
    checked: int = 0
    fault: ChainFault | None = None

    @property
    def ok(self) -> bool:
        return self.fault is None


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
    except (ValueError, RecursionError):  # not JSON, or nested past any event's shape
        return []


def blob_line(obj: str, sha256: str, data: bytes) -> bytes:
    body = {"kind": BLOB_KIND, "object": obj, "sha256": sha256, "size": len(data),
            "data": base64.b64encode(data).decode()}  # fmt: skip
    return json.dumps(body, separators=(",", ":")).encode()


class Sealer:
    """What an exporter feeds its lines through: it counts the events, keeps each subject's
    head and each blob's digest, and at the end writes the seal, signed by `signer` (an
    exporter with no key writes an unsigned seal, which a key set requiring signatures
    refuses)."""

    def __init__(self, filter_subject: str, signer: Signer | None) -> None:
        self.filter = filter_subject
        self.signer = signer
        self.heads: dict[str, tuple[int, str]] = {}
        self.events = 0
        self.blobs: set[str] = set()

    def event(self, subject: str, seq: int, digest: str | None) -> None:
        self.heads[subject] = (seq, digest or "")
        self.events += 1

    def blob(self, sha256: str) -> None:
        self.blobs.add(sha256)

    def line(self) -> bytes:
        seal = unsigned_seal(self.filter, self.heads, self.events, self.blobs)
        return (seal.signed(self.signer) if self.signer is not None else seal).line()


def session_filter_of(subject: str) -> str | None:
    """`fleet.session.<tenant>.<session>.>` for a subject of a session, else None."""
    where = subjects.parse_session(subject)
    return None if where is None else where.scope


def _fault(row: EventRow | None, reason: str) -> ChainFault:
    if row is None:
        return ChainFault("?", -1, "?", reason)
    return ChainFault(row.subject, row.seq, row.id, reason)


def _parse(lines: Iterable[bytes], bundle: Bundle) -> ChainFault | None:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if bundle.seal is not None:
            return _fault(None, f"line {number} comes after the export's seal (the seal is last)")
        try:
            row = json.loads(line)
            kind = row.get("kind")
            if kind == KEYSET_KIND:
                continue
            if kind == BLOB_KIND:
                data = base64.b64decode(row["data"], validate=True)
                sha = str(row["sha256"])
                if hashlib.sha256(data).hexdigest() != sha:
                    return _fault(None, f"blob line {number} does not match its sha256 {sha[:16]}…")
                bundle.blobs[sha] = data
                continue
            if kind == SEAL_KIND:
                bundle.seal = Seal.parse(row)
                continue
            if kind is not None:
                return _fault(None, f"line {number} is a {kind!r} record, which no export holds")
            bundle.events.append(
                EventRow(
                    str(row["subject"]), int(row["seq"]), str(row["id"]), row.get("prev"),
                    str(row.get("hash")), base64.b64decode(row["payload"], validate=True),
                    row.get("key"), row.get("sig"),
                )
            )  # fmt: skip
        except SigningError as exc:
            return _fault(None, f"line {number}: {exc}")
        except RecursionError:
            return _fault(
                None,
                f"export line {number} nests JSON deeper than any export does: it is not an "
                "export fleet wrote",
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return _fault(None, f"export line {number} is unreadable: {exc!r}")
    return None


def _missing_blob(bundle: Bundle) -> ChainFault | None:
    for row in bundle.events:
        for _, sha, _ in payload_refs(row.payload):
            if sha not in bundle.blobs:
                return _fault(row, f"names blob {sha[:16]}… that the export does not carry")
            for _, inner, _ in payload_refs(bundle.blobs[sha]):  # an offloaded envelope's own
                if inner not in bundle.blobs:
                    return _fault(row, f"names blob {inner[:16]}… that the export does not carry")
    return None


def _seal_fault(bundle: Bundle, within: str, keys: KeySet | None) -> ChainFault | None:
    """The seal against the lines: every subject's head, the count, the blobs."""
    seal = bundle.seal
    assert seal is not None
    if keys is not None and (problem := seal.signature_problem(keys)) is not None:
        return _fault(None, problem)
    if seal.filter != within:
        return _fault(None, f"the seal is of {seal.filter}, the events of {within}")
    heads: dict[str, tuple[int, str]] = {}
    for row in bundle.events:
        if row.subject not in seal.heads:
            return _fault(row, "is on a subject the export's seal does not name (spliced in)")
        heads[row.subject] = (row.seq, row.hash)
    for subject, (seq, digest) in sorted(seal.heads.items()):
        have = heads.get(subject)
        if have is None:
            return ChainFault(subject, seq, "?", "the seal names this subject; no event of it")
        if have != (seq, digest):
            return ChainFault(
                subject, have[0], "?",
                f"the subject ends at seq {have[0]}, its seal at seq {seq}: the export was "
                "cut short or altered after it was sealed",
            )  # fmt: skip
    if seal.events != len(bundle.events):
        return _fault(None, f"the seal counts {seal.events} events, the export holds "
                      f"{len(bundle.events)}")  # fmt: skip
    carried = set(bundle.blobs)
    for sha in sorted(set(seal.blobs) - carried):
        return _fault(None, f"the seal names blob {sha[:16]}…, which the export does not carry")
    for sha in sorted(carried - set(seal.blobs)):
        return _fault(None, f"the export carries blob {sha[:16]}…, which its seal does not name")
    return None


def read_bundle(
    lines: Iterable[bytes],
    *,
    keys: KeySet | None = None,
    checkpoints: Sequence[Checkpoint] = (),
    require_seal: bool | None = None,
) -> Bundle:
    """Parse and check: every chain over the stored bytes; with `keys`, every signature; one
    session only; every blob an event names present with its digest; with `checkpoints`
    (signed by a pinned checkpoint key), every head they pinned for the session; and the
    seal, which is required when `keys` are given (unless `require_seal` says otherwise) and,
    when present, must match the lines whether or not keys are given. `fault` names the
    first problem; an export with a fault must not be used."""
    bundle = Bundle()
    bundle.fault = _parse(lines, bundle) or checkpoint_fault(checkpoints, keys)
    if bundle.fault is not None:
        return bundle
    if not bundle.events:
        bundle.fault = _fault(None, "the export holds no event")
        return bundle
    within = session_filter_of(bundle.events[0].subject)
    if within is None:
        bundle.fault = _fault(bundle.events[0], "is not an event of a session")
        return bundle
    pinned = CheckpointIndex.of(checkpoints, within) if checkpoints else None
    verifier = ChainVerifier(keys=keys, checkpoints=pinned)
    for row in bundle.events:
        if session_filter_of(row.subject) != within:
            bundle.checked = verifier.checked
            bundle.fault = _fault(row, f"belongs to another session than {within[:-2]}")
            return bundle
        if verifier.feed(row.subject, row.seq, row.id, row.prev, row.hash, row.payload,
                         row.key, row.sig):  # fmt: skip
            break
    bundle.checked = verifier.checked
    bundle.fault = verifier.finish(all_pinned=bool(checkpoints)) or _missing_blob(bundle)
    if bundle.fault is not None:
        return bundle
    if bundle.seal is None:
        if keys is not None if require_seal is None else require_seal:
            bundle.fault = _fault(
                None,
                "the export ends without its seal: it was cut short (truncated), or its last "
                "line was removed; export the session again",
            )
        return bundle
    bundle.fault = _seal_fault(bundle, within, keys)
    return bundle
