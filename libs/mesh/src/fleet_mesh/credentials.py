"""Per-role NATS credentials: an NKey seed file per process kind, and the servers' users.

`fleet up` (and the test harness) makes one directory of seeds, `<role>.nk`, each written 0600
from its first byte in a 0700 directory; the servers' configuration names each role's public
key with the allow-lists `fleet_events.access.permissions` derives from the bus catalog. A
process connects with its own file (`FLEET_NATS_CREDENTIALS`): the role is the file's name,
its inbox prefix follows from the role, and the seed signs the server's nonce (nats-py, with
the `nkeys` package). No seed is ever logged, printed or passed on a command line: the paths
travel, the files stay put.
"""

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from fleet_events.access import ROLES, check_role, inbox_prefix, permissions

SUFFIX = ".nk"
CREDENTIALS_ENV = "FLEET_NATS_CREDENTIALS"
"""The seed file this process connects with (its name is its role: `agent.nk`)."""
CREDENTIALS_DIR_ENV = "FLEET_NATS_CREDENTIALS_DIR"
"""A directory of every role's seed: servers this process starts require them, and each
service it starts gets its own role's file (the test harness sets it; so may an operator
joining a cluster whose users were made from the same directory)."""


class CredentialsError(RuntimeError):
    """A credentials file that cannot be used; the message says which and what to do."""


@dataclass(frozen=True)
class Credentials:
    """One directory of seeds, one per role (`ensure_credentials` makes it)."""

    directory: Path

    def seed_path(self, role: str) -> Path:
        return self.directory / f"{check_role(role)}{SUFFIX}"

    def public_key(self, role: str) -> str:
        return str(_keypair(self.seed_path(role)).public_key.decode())

    def users(self) -> list[dict[str, object]]:
        return [
            {"nkey": self.public_key(role), "permissions": permissions(role).config()}
            for role in ROLES
        ]

    def authorization_config(self) -> str:
        """nats-server's `authorization` block: every role a user by its public key. (The
        server's format reads JSON; subjects with `$` and `>` are quoted strings in it.)"""
        return "authorization: " + json.dumps({"users": self.users()}, indent=2) + "\n"


def ensure_credentials(directory: Path) -> Credentials:
    """Every role's seed under `directory`, making those missing (existing ones are kept:
    a restarted mesh keeps its users)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    for role in ROLES:
        path = directory / f"{role}{SUFFIX}"
        if path.exists():
            continue
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(seed)
    return Credentials(directory)


def role_of(path: Path) -> str:
    role = path.name.removesuffix(SUFFIX)
    if not path.name.endswith(SUFFIX) or role not in ROLES:
        raise CredentialsError(
            f"{path} is not a credentials file: its name must be <role>{SUFFIX}, the role one "
            f"of {', '.join(ROLES)}"
        )
    return role


def check_file(path: Path) -> str:
    """The role of a readable, private seed file; raises naming what is wrong."""
    role = role_of(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        raise CredentialsError(
            f"{CREDENTIALS_ENV}={path}: no such file; give the path of this process's seed "
            "(`fleet up` writes them under <data dir>/nats/credentials)"
        ) from None
    if mode & 0o077:
        raise CredentialsError(
            f"NATS credentials {path} have mode {mode:o}: other users could read them; "
            f"chmod 600 {path} (and make new ones if they may have leaked)"
        )
    _keypair(path)
    return role


def _keypair(path: Path) -> Any:
    try:
        return nkeys.from_seed(bytearray(path.read_bytes().strip()))
    except (nkeys.NkeysError, ValueError):
        raise CredentialsError(
            f"{path} does not hold an NKey user seed; remove it and let `fleet up` make another"
        ) from None


def env_for(role: str) -> dict[str, str]:
    """`FLEET_NATS_CREDENTIALS` for a process of `role` this one starts, from the directory
    `FLEET_NATS_CREDENTIALS_DIR` names (where this process's servers require those users);
    nothing where there is none."""
    directory = os.environ.get(CREDENTIALS_DIR_ENV)
    if not directory:
        return {}
    return {CREDENTIALS_ENV: str(Credentials(Path(directory)).seed_path(role))}


def connect_options(path: Path) -> dict[str, str]:
    """nats-py's `connect` arguments for a seed file: the seed and the role's inbox prefix."""
    role = check_file(path)
    return {"nkeys_seed": str(path), "inbox_prefix": inbox_prefix(role)}


def main(argv: list[str] | None = None) -> None:
    """`python -m fleet_mesh.credentials DIR`: every role's seed under DIR (made when missing)
    and `DIR/authorization.conf`, the block to include in each node's configuration of a
    cluster the mesh joins (public keys and permissions only: no seed leaves its file)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m fleet_mesh.credentials", description=main.__doc__
    )
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    credentials = ensure_credentials(args.directory)
    block = args.directory / "authorization.conf"
    block.write_text(credentials.authorization_config())
    print(f"seeds for {', '.join(ROLES)} under {args.directory}; include {block} in each node's")
    print(f"configuration, then run the mesh with {CREDENTIALS_DIR_ENV}={args.directory}")


if __name__ == "__main__":
    main()
