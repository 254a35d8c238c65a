"""Signatures over the hash chain: who appended each event, and signed checkpoints of heads.

The chain alone only catches accidents: anyone who can publish can compute `Fleet-Prev` and
`Fleet-Hash` themselves. So each service replica signs, with its own Ed25519 key, a statement
naming the subject and the chain hash it appends (`append_statement`), carried in `Fleet-Sig`
and `Fleet-Key`; a verifier pins the public keys (`KeySet`) and refuses an event signed by no
key in the set. A key set that `require_signatures` also refuses an unsigned event; one that
does not (a mesh being migrated) accepts unsigned events and still refuses a bad signature.

A service key signs whatever its holder appends, so a stolen one could sign a rewritten chain.
Checkpoints close that: a key no service holds signs the heads it has seen (`Checkpoint`),
each checkpoint chained to the one before, and the verifier compares the log with them.

Pure: the store signs and checks with it, and so does an auditor with no server.
"""

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from fleet_events import subjects

SIG_HEADER = "Fleet-Sig"
KEY_HEADER = "Fleet-Key"

APPEND = "append"  # the role of a service's key: it signs appends
CHECKPOINT = "checkpoint"  # the role of the checkpointer's key: it signs checkpoints
ROLES = (APPEND, CHECKPOINT)

KEY_FILE_KIND = "fleet-signing-key"
KEYSET_KIND = "fleet-keyset"
CHECKPOINT_KIND = "fleet-checkpoint"

SIGNING_KEY_ENV = "FLEET_SIGNING_KEY"  # path of the key file a service signs its appends with

_APPEND_DOMAIN = b"fleet-append/v1\n"  # a signature over an append can never pass as a checkpoint
_CHECKPOINT_DOMAIN = b"fleet-checkpoint/v1\n"


class SigningError(ValueError):
    """A key file or key set that cannot be used, and what to do about it."""


def append_statement(subject: str, digest: str) -> bytes:
    """What a service signs: the subject and the chain hash, which covers the stored bytes and,
    through `prev`, everything before them on that subject."""
    return _APPEND_DOMAIN + subject.encode() + b"\n" + digest.encode()


def key_id_of(public: bytes) -> str:
    return hashlib.sha256(public).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SigningError(f"{what} is not base64: {exc}") from exc


@dataclass(frozen=True)
class Signer:
    """One private key: a service's (role `append`) or the checkpointer's (`checkpoint`)."""

    owner: str
    role: str
    key: SigningKey = field(repr=False)

    @classmethod
    def generate(cls, owner: str, role: str = APPEND) -> "Signer":
        if role not in ROLES:
            raise SigningError(f"key role {role!r} is not one of {ROLES}")
        return cls(owner, role, SigningKey.generate())

    @property
    def public(self) -> bytes:
        return bytes(self.key.verify_key)

    @property
    def key_id(self) -> str:
        return key_id_of(self.public)

    def sign(self, message: bytes) -> str:
        return _b64(self.key.sign(message).signature)

    def sign_append(self, subject: str, digest: str) -> str:
        return self.sign(append_statement(subject, digest))

    def file_text(self) -> str:
        return json.dumps(
            {
                "kind": KEY_FILE_KIND,
                "owner": self.owner,
                "role": self.role,
                "key_id": self.key_id,
                "seed": _b64(bytes(self.key)),
            }
        )

    @classmethod
    def parse(cls, text: str, where: str) -> "Signer":
        """A key file's text (`file_text`); `where` names it in errors (its path)."""
        try:
            row = json.loads(text)
            if row.get("kind") != KEY_FILE_KIND:
                kind = row.get("kind")
                raise SigningError(f"{where} is not a {KEY_FILE_KIND} file (kind {kind!r})")
            seed = SigningKey(_unb64(row["seed"], "seed"))
            signer = cls(str(row["owner"]), str(row["role"]), seed)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, SigningError):
                raise
            raise SigningError(f"signing key {where} is unreadable: {exc!r}") from exc
        if signer.role not in ROLES:
            raise SigningError(f"signing key {where} has role {signer.role!r}, not one of {ROLES}")
        return signer


@dataclass(frozen=True)
class PublicKey:
    key_id: str
    owner: str
    role: str
    verify_key: VerifyKey = field(repr=False)


@dataclass(frozen=True)
class KeySet:
    """The public keys a verifier pins, their owners and roles, and whether every event must be
    signed. A deployment pins "signatures required" by handing its auditors this file with
    `require_signatures: true` (`fleet up` writes it so)."""

    keys: Mapping[str, PublicKey]
    require_signatures: bool = True

    @classmethod
    def of(cls, signers: Iterable[Signer], *, require_signatures: bool = True) -> "KeySet":
        keys = {s.key_id: PublicKey(s.key_id, s.owner, s.role, s.key.verify_key) for s in signers}
        return cls(keys, require_signatures)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KEYSET_KIND,
            "require_signatures": self.require_signatures,
            "keys": [
                {"key_id": k.key_id, "owner": k.owner, "role": k.role,
                 "public": _b64(bytes(k.verify_key))}
                for k in sorted(self.keys.values(), key=lambda k: k.key_id)
            ],
        }  # fmt: skip

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> "KeySet":
        if row.get("kind") != KEYSET_KIND:
            kind = row.get("kind")
            raise SigningError(f"not a key set (kind {kind!r}, expected {KEYSET_KIND!r})")
        keys: dict[str, PublicKey] = {}
        try:
            require = row["require_signatures"]
            if not isinstance(require, bool):
                raise SigningError(f"require_signatures must be true or false, got {require!r}")
            for entry in row["keys"]:
                public = _unb64(entry["public"], f"public key {entry.get('key_id')!r}")
                kid = key_id_of(public)
                if entry["key_id"] != kid:
                    raise SigningError(f"key id {entry['key_id']!r} does not match its key ({kid})")
                if entry["role"] not in ROLES:
                    raise SigningError(f"key {kid} has role {entry['role']!r}, not one of {ROLES}")
                keys[kid] = PublicKey(kid, str(entry["owner"]), entry["role"], VerifyKey(public))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SigningError):
                raise
            raise SigningError(f"key set is malformed: {exc!r}") from exc
        return cls(keys, require)

    @classmethod
    def parse(cls, text: str, where: str) -> "KeySet":
        """A key set file's text; `where` names it in errors (its path)."""
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SigningError(f"key set {where} is not JSON: {exc}") from exc
        return cls.from_json(row)

    def _check(self, role: str, key_id: str, sig: str, message: bytes) -> str | None:
        key = self.keys.get(key_id)
        if key is None:
            return f"signed by key {key_id}, which is not in the pinned key set"
        if key.role != role:
            return f"signed by {key.owner}'s {key.role} key {key_id}, which may not sign {role}s"
        try:
            key.verify_key.verify(message, base64.b64decode(sig, validate=True))
        except (BadSignatureError, binascii.Error, ValueError):
            return f"signature by {key.owner} (key {key_id}) does not verify"
        return None

    def signed_problem(self, role: str, key_id: str, sig: str, message: bytes) -> str | None:
        """Why `sig` is not `role`'s signature of `message` by a pinned key (None: it is)."""
        return self._check(role, key_id, sig, message)

    def append_problem(
        self, subject: str, digest: str, key_id: str | None, sig: str | None
    ) -> str | None:
        """Why this event's signature is not acceptable (None: it is)."""
        if key_id is None and sig is None:
            if self.require_signatures:
                return "unsigned, and the pinned key set requires signatures"
            return None
        if key_id is None or sig is None:
            return f"half a signature ({KEY_HEADER} or {SIG_HEADER} missing)"
        return self._check(APPEND, key_id, sig, append_statement(subject, digest))


@dataclass(frozen=True)
class Checkpoint:
    """The checkpointer's signed word on a stream's chain heads at one moment.

    `heads` maps a subject to (sequence, hash) of its head; `purged` maps a subject to the last
    (sequence, hash) removed by an admin purge, which excuses that much of the subject from
    being present. Each checkpoint names the digest of the one before (`prev`), so a missing,
    reordered or altered checkpoint breaks the checkpoint chain.
    """

    number: int
    prev: str
    stream: str
    ts: str
    upto: int  # the stream sequence the checkpointer had read through
    heads: Mapping[str, tuple[int, str]]
    purged: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    key_id: str = ""
    sig: str = ""

    def body(self) -> dict[str, Any]:
        return {
            "kind": CHECKPOINT_KIND,
            "number": self.number,
            "prev": self.prev,
            "stream": self.stream,
            "ts": self.ts,
            "upto": self.upto,
            "heads": {s: list(h) for s, h in sorted(self.heads.items())},
            "purged": {s: list(h) for s, h in sorted(self.purged.items())},
        }

    def statement(self) -> bytes:
        return _CHECKPOINT_DOMAIN + json.dumps(self.body(), sort_keys=True).encode()

    def digest(self) -> str:
        return hashlib.sha256(self.statement()).hexdigest()

    def signed(self, signer: Signer) -> "Checkpoint":
        if signer.role != CHECKPOINT:
            who = f"{signer.owner}'s key is a {signer.role} key"
            raise SigningError(f"{who}: it may not sign checkpoints")
        return Checkpoint(
            self.number, self.prev, self.stream, self.ts, self.upto, self.heads, self.purged,
            signer.key_id, signer.sign(self.statement()),
        )  # fmt: skip

    def line(self) -> bytes:
        return json.dumps({**self.body(), "key": self.key_id, "sig": self.sig}).encode()

    @classmethod
    def parse(cls, line: bytes | str) -> "Checkpoint":
        try:
            row = json.loads(line)
            if row.get("kind") != CHECKPOINT_KIND:
                raise SigningError(f"not a checkpoint (kind {row.get('kind')!r})")

            def pairs(key: str) -> dict[str, tuple[int, str]]:
                return {str(s): (int(h[0]), str(h[1])) for s, h in row[key].items()}

            return cls(
                int(row["number"]), str(row["prev"]), str(row["stream"]), str(row["ts"]),
                int(row["upto"]), pairs("heads"), pairs("purged"), str(row["key"]), str(row["sig"]),
            )  # fmt: skip
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
            if isinstance(exc, SigningError):
                raise
            raise SigningError(f"checkpoint line is malformed: {exc!r}") from exc


GENESIS_CHECKPOINT = "0" * 64


subject_matches = subjects.matches


def checkpoint_chain_problem(checkpoints: Iterable[Checkpoint], keys: KeySet) -> str | None:
    """Why a sequence of checkpoints cannot be trusted (None: each is signed by a pinned
    checkpoint key and follows the one before, from the first)."""
    prev, expected = GENESIS_CHECKPOINT, 1
    for cp in checkpoints:
        where = f"checkpoint {cp.number}"
        if cp.number != expected:
            return f"{where} where checkpoint {expected} was expected (one missing or reordered)"
        if cp.prev != prev:
            return f"{where} does not follow checkpoint {expected - 1} (its prev digest differs)"
        problem = keys._check(CHECKPOINT, cp.key_id, cp.sig, cp.statement())
        if problem is not None:
            return f"{where}: {problem}"
        prev, expected = cp.digest(), expected + 1
    return None


@dataclass
class CheckpointIndex:
    """What the checkpoints say each subject held: every checkpointed (seq, hash), and how far
    an admin purge (a receipt in a checkpoint) excuses a subject."""

    pinned: dict[str, dict[int, tuple[str, int]]] = field(default_factory=dict)
    purged_upto: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, checkpoints: Iterable[Checkpoint], within: str | None = None) -> "CheckpointIndex":
        """`within` (a subject filter, e.g. a session's): only the subjects it matches, and
        each of them must then be in the log (`missing`), even one purged whole."""
        index = cls()
        for cp in checkpoints:
            for subject, (seq, digest) in cp.heads.items():
                if within is not None and not subject_matches(within, subject):
                    continue
                index.pinned.setdefault(subject, {})[seq] = (digest, cp.number)
            for subject, (seq, _) in cp.purged.items():
                index.purged_upto[subject] = max(seq, index.purged_upto.get(subject, 0))
        return index

    def event_problem(self, subject: str, seq: int, digest: str) -> str | None:
        pin = self.pinned.get(subject, {}).get(seq)
        if pin is not None and pin[0] != digest:
            return (
                f"checkpoint {pin[1]} pinned hash {pin[0][:12]}… at this sequence; the log holds "
                f"{digest[:12]}… (rewritten after the checkpoint)"
            )
        return None

    def missing(
        self, seen: Mapping[str, set[int]], subjects: Iterable[str]
    ) -> tuple[str, int, str] | None:
        """A checkpointed event of one of `subjects` that the log no longer holds and no purge
        receipt excuses: the subject was purged and rewritten (or cut) behind the audit."""
        for subject in sorted(subjects):
            excused = self.purged_upto.get(subject, 0)
            for seq, (digest, number) in sorted(self.pinned.get(subject, {}).items()):
                if seq > excused and seq not in seen.get(subject, set()):
                    return (
                        subject,
                        seq,
                        (
                            f"checkpoint {number} pinned hash {digest[:12]}… at this sequence, "
                            "which the log no longer holds and no purge receipt covers (purged or "
                            "rewritten after the checkpoint)"
                        ),
                    )
        return None
