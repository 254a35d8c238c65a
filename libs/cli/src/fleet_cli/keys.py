"""The local mesh's signing keys: one per service and one for the checkpointer, made once in
`<data dir>/keys` by `fleet up`, with the public key set an auditor pins.

Private key files are mode 0600 in a 0700 directory, and each service is given the path of its
own only (`FLEET_SIGNING_KEY`), as the secrets key is given: in a cluster the same file is a
mounted secret per service. The checkpoint key is handed to no service. `keyset.json` holds
only public keys, with `require_signatures: true`: a mesh started by `fleet up` signs every
append, so an auditor pinning this file refuses any unsigned event.
"""

import json
from collections.abc import Iterable
from pathlib import Path

from fleet_events.signing import APPEND, CHECKPOINT, SIGNING_KEY_ENV, KeySet, Signer

KEYS_DIR = "keys"
KEYSET_FILE = "keyset.json"
KEYSET_ENV = "FLEET_KEYSET"
CHECKPOINTER = "checkpointer"


def keys_dir(data_dir: Path) -> Path:
    return (data_dir / KEYS_DIR).resolve()


def key_path(data_dir: Path, owner: str) -> Path:
    return keys_dir(data_dir) / f"{owner}.key"


def ensure_keys(data_dir: Path, services: Iterable[str]) -> KeySet:
    """Make the keys that are missing (never replace one: exports signed with it must keep
    verifying) and rewrite the public key set from the key files present."""
    directory = keys_dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    wanted = [(service, APPEND) for service in services] + [(CHECKPOINTER, CHECKPOINT)]
    signers = []
    for owner, role in wanted:
        path = key_path(data_dir, owner)
        if not path.exists():
            Signer.generate(owner, role).write(path)
        signers.append(Signer.read(path))
    keys = KeySet.of(signers, require_signatures=True)
    keyset = directory / KEYSET_FILE
    staged = keyset.with_suffix(".tmp")
    staged.write_text(json.dumps(keys.to_json(), indent=2) + "\n")
    staged.replace(keyset)  # a reader never sees half a key set
    return keys


def signing_env(data_dir: Path, service: str) -> dict[str, str]:
    """What one service is given: its own key file and the public key set."""
    return {
        SIGNING_KEY_ENV: str(key_path(data_dir, service)),
        KEYSET_ENV: str(keys_dir(data_dir) / KEYSET_FILE),
    }
