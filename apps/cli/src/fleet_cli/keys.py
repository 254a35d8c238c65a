"""The local mesh's signing keys: one per service and one for the checkpointer, made once in
`<data dir>/keys` by `fleet up`, with the public key set an auditor pins.

Private key files are mode 0600 in a 0700 directory, and each service is given the path of its
own only (`FLEET_SIGNING_KEY`), as the secrets key is given: in a cluster the same file is a
mounted secret per service. The checkpoint key is handed to no service. `keyset.json` holds
only public keys, with `require_signatures: true`: a mesh started by `fleet up` signs every
append, so an auditor pinning this file refuses any unsigned event.
"""

import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from fleet_events.signing import APPEND, CHECKPOINT, SIGNING_KEY_ENV, KeySet, Signer, SigningError
from fleet_events.subjects import SERVICES
from fleet_mesh import service
from fleet_mesh.checkpoints import INTERVAL_ENV, KEYSET_ENV, Checkpointer, checkpointer_setup
from fleet_mesh.keyfiles import read_signer, write_signer
from fleet_mesh.settings import MeshSettings

KEYS_DIR = "keys"
KEYSET_FILE = "keyset.json"
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
            write_signer(Signer.generate(owner, role), path)
        signers.append(read_signer(path))
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


CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_INTERVAL_S = 10.0


@contextlib.asynccontextmanager
async def checkpointing(
    nats_url: str,
    data_dir: Path,
    *,
    interval_s: float | None = None,
    credentials: Path | None = None,
) -> AsyncIterator[Checkpointer]:
    """The checkpointer as a role of `fleet up`'s own process, the one process that holds the
    checkpoint key (no service is given it), on the same life as a service
    (`fleet_mesh.service.running`: its purges stop first, then its loop, on a bounded drain).
    Its file lives in `<data dir>/checkpoints`, out of the NATS store; one that does not verify
    stops `fleet up` before any service starts. It runs until the `async with` ends (fleet up's
    signal handling ends it)."""
    keys = ensure_keys(data_dir, SERVICES)
    directory = (data_dir / CHECKPOINTS_DIR).resolve()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    signer = read_signer(key_path(data_dir, CHECKPOINTER))
    period = interval_s if interval_s is not None else _interval()
    made: list[Checkpointer] = []
    setup = checkpointer_setup(signer, keys, directory, period, started=made.append)
    # its own NATS user (`credentials`: the checkpointer's seed), not the admin's of fleet up
    settings = MeshSettings(nats_url=nats_url, replica=CHECKPOINTER, credentials=credentials)
    async with service.running(CHECKPOINTER, setup, settings=settings):
        yield made[0]


def _interval() -> float:
    value = os.environ.get(INTERVAL_ENV, str(CHECKPOINT_INTERVAL_S))
    try:
        return float(value)
    except ValueError as exc:
        raise SigningError(f"{INTERVAL_ENV}={value!r} is not a number of seconds") from exc
