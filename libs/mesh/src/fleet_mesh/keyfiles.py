"""Key files on disk: the service signing keys and key sets of `fleet_events.signing`, read
and written here so the vocabulary stays pure (it parses and prints their text; this module
owns the files, their modes and the environment variable that names a service's key).

Imports nothing from NATS, so an offline auditor (`fleet audit verify`) may use it.
"""

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from fleet_events.signing import APPEND, SIGNING_KEY_ENV, KeySet, Signer, SigningError


def write_signer(signer: Signer, path: Path) -> None:
    """Written with mode 0600 from its first byte: never readable by another user."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(signer.file_text())


def read_signer(path: Path) -> Signer:
    """A signing key file; refused when another user could read it."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SigningError(
            f"signing key {path} has mode {mode:o}: other users could read it; "
            f"chmod 600 {path} (or generate a new key if it may have leaked)"
        )
    return Signer.parse(path.read_text(), str(path))


def read_keyset(path: Path) -> KeySet:
    return KeySet.parse(path.read_text(), str(path))


def signer_from_env(env: Mapping[str, str] | None = None) -> Signer | None:
    """The key this process appends with (`FLEET_SIGNING_KEY`), or None: it appends unsigned."""
    path = (os.environ if env is None else env).get(SIGNING_KEY_ENV)
    if not path:
        return None
    signer = read_signer(Path(path))
    if signer.role != APPEND:
        raise SigningError(
            f"{SIGNING_KEY_ENV}={path} is a {signer.role} key; services sign with an append key"
        )
    return signer
