"""An export's seal: the last line of an export, signed, naming everything the export holds.

Each event's signature vouches for its chain up to it, so cutting lines off the end of an
export (or dropping its blob lines) leaves every remaining line valid: a truncated export used
to verify and import. The seal closes that, as a signed tree head does for a transparency log:
the exporting process signs, with its append key, the filter the export was cut with, the head
(sequence, hash) of every subject in it, the number of events and the digests of every blob
line. A verifier that pins keys requires the seal and compares it with what the lines hold; a
line missing anywhere, a subject spliced in from another export, a blob line dropped or added
is then named.

Pure: the exporter builds and signs it, `fleet_mesh.bundle` checks it.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet_events.signing import APPEND, KeySet, Signer, SigningError

SEAL_KIND = "fleet-export-seal"
_SEAL_DOMAIN = b"fleet-export-seal/v1\n"  # a seal's signature can pass for no append


@dataclass(frozen=True)
class Seal:
    filter: str
    heads: Mapping[str, tuple[int, str]]
    events: int
    blobs: tuple[str, ...] = ()
    """The sha256 of every blob line, sorted."""
    key_id: str = ""
    sig: str = ""

    def body(self) -> dict[str, Any]:
        return {
            "kind": SEAL_KIND,
            "filter": self.filter,
            "heads": {s: list(h) for s, h in sorted(self.heads.items())},
            "events": self.events,
            "blobs": sorted(self.blobs),
        }

    def statement(self) -> bytes:
        return _SEAL_DOMAIN + json.dumps(self.body(), sort_keys=True).encode()

    def signed(self, signer: Signer) -> "Seal":
        if signer.role != APPEND:
            raise SigningError(f"{signer.owner}'s {signer.role} key may not seal an export")
        return Seal(
            self.filter, dict(self.heads), self.events, tuple(sorted(self.blobs)),
            signer.key_id, signer.sign(self.statement()),
        )  # fmt: skip

    def line(self) -> bytes:
        row = {**self.body(), "key": self.key_id or None, "sig": self.sig or None}
        return json.dumps(row, separators=(",", ":")).encode()

    def signature_problem(self, keys: KeySet) -> str | None:
        """Why this seal is not vouched for by a pinned key (None: it is)."""
        if not self.key_id or not self.sig:
            if keys.require_signatures:
                return "the export's seal is unsigned, and the pinned key set requires signatures"
            return None
        problem = keys.signed_problem(APPEND, self.key_id, self.sig, self.statement())
        return None if problem is None else f"the export's seal: {problem}"

    @classmethod
    def parse(cls, row: Mapping[str, Any]) -> "Seal":
        """From a decoded seal line; `SigningError` naming what is malformed."""
        try:
            if row.get("kind") != SEAL_KIND:
                raise SigningError(f"not an export seal (kind {row.get('kind')!r})")
            heads = {str(s): (int(h[0]), str(h[1])) for s, h in row["heads"].items()}
            blobs = tuple(str(b) for b in row["blobs"])
            events = row["events"]
            if not isinstance(events, int) or isinstance(events, bool) or events < 0:
                raise SigningError(f"the seal's event count {events!r} is not a count")
            key, sig = row.get("key"), row.get("sig")
            return cls(
                str(row["filter"]), heads, events, blobs,
                str(key) if key else "", str(sig) if sig else "",
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise SigningError(f"the export's seal is malformed: {exc!r}") from exc


def unsigned_seal(
    filter_subject: str, heads: Mapping[str, tuple[int, str]], events: int, blobs: set[str]
) -> Seal:
    return Seal(filter_subject, dict(heads), events, tuple(sorted(blobs)))
