"""The secrets store: LLM API keys and other credentials, sealed in the `fleet-secrets` bucket.

Every service replica on any host must read a secret at the moment it uses it (so a rotation
applies at once), while the gateway, which takes keys from users, must be able to write one
and never read it back. So values are sealed (libsodium's `SealedBox`: X25519 + XSalsa20-
Poly1305, from PyNaCl) to the services' public key. Only holders of the private key, a file
given to services (a mounted secret in a cluster), can open them; the gateway is given the
public key only. What is stored is ciphertext, so the bucket, its history, a backup or a NATS
trace show no key.

A sealed value carries the bucket key it was written under and is opened only under that key:
a ciphertext copied to another tenant's or another secret's name is refused, not used.
Scopes never cross: a tenant's profile resolves only its tenant's secrets, a global profile only
global ones (a tenant profile pointing a global key at its own server would leak it).
"""

import base64
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from fleet_events import check_id, streams

PRIVATE_KEY_ENV = "FLEET_SECRETS_KEY"
"""Path of the services' private key file (services only; never the gateway)."""
PUBLIC_KEY_ENV = "FLEET_SECRETS_PUBLIC_KEY"
"""Path of the services' public key file (what the gateway and the bootstrap seal with)."""

PRIVATE_FILE = "services.key"
PUBLIC_FILE = "services.pub"
MAX_SECRET_BYTES = 16 * 1024


class SecretError(Exception):
    """Base of the store's errors; messages name the secret, never its value."""


class SecretNotFound(SecretError, LookupError):
    pass


class SecretRefused(SecretError):
    """A stored value that does not open, or opens under another name: never used."""


class KeyFileError(SecretError):
    pass


def secret_key(name: str, tenant: str | None = None) -> str:
    check_id("secret", name)
    if tenant is None:
        return f"global.{name}"
    return f"tenant.{check_id('tenant', tenant)}.{name}"


class _Sealed(msgspec.Struct, frozen=True):
    key: str
    value: str


# -- key files ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyFiles:
    private: Path
    public: Path


def ensure_keypair(directory: Path) -> KeyFiles:
    """The services' key pair in `directory`, made once (0600 private, 0644 public)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = KeyFiles(directory / PRIVATE_FILE, directory / PUBLIC_FILE)
    if not files.private.exists():
        key = PrivateKey.generate()
        fd = os.open(files.private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(base64.b64encode(bytes(key)) + b"\n")
        files.public.write_bytes(base64.b64encode(bytes(key.public_key)) + b"\n")
    elif not files.public.exists():
        files.public.write_bytes(
            base64.b64encode(bytes(load_private_key(files.private).public_key)) + b"\n"
        )
    return files


def _read_key(path: Path, what: str) -> bytes:
    try:
        raw = base64.b64decode(path.read_bytes().strip(), validate=True)
    except FileNotFoundError:
        raise KeyFileError(f"the {what} file {path} does not exist") from None
    except ValueError:
        raise KeyFileError(f"the {what} file {path} is not base64 of a 32-byte key") from None
    if len(raw) != 32:
        raise KeyFileError(f"the {what} file {path} holds {len(raw)} bytes, not a 32-byte key")
    return raw


def load_private_key(path: Path) -> PrivateKey:
    mode = path.stat().st_mode if path.exists() else 0
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"the services' private key {path} is readable by others (mode {oct(mode & 0o777)}): "
            f"chmod 600 {path}"
        )
    return PrivateKey(_read_key(path, "services' private key"))


def load_public_key(path: Path) -> PublicKey:
    return PublicKey(_read_key(path, "services' public key"))


def private_key_from_env(env: Mapping[str, str] | None = None) -> PrivateKey | None:
    path = (os.environ if env is None else env).get(PRIVATE_KEY_ENV)
    return load_private_key(Path(path)) if path else None


def public_key_from_env(env: Mapping[str, str] | None = None) -> PublicKey | None:
    """The public key from `FLEET_SECRETS_PUBLIC_KEY`, else derived from the private key."""
    source = os.environ if env is None else env
    if source.get(PUBLIC_KEY_ENV):
        return load_public_key(Path(source[PUBLIC_KEY_ENV]))
    private = private_key_from_env(source)
    return private.public_key if private is not None else None


# -- the two sides -----------------------------------------------------------------------------


class SecretsWriter:
    """The gateway's (and the bootstrap's) side: seal and store; it has no way to open."""

    def __init__(self, kv: KeyValue, public_key: PublicKey) -> None:
        self._kv = kv
        self._box = SealedBox(public_key)

    @classmethod
    async def open(cls, js: JetStreamContext, public_key: PublicKey) -> "SecretsWriter":
        return cls(await js.key_value(streams.SECRETS.bucket), public_key)

    async def put(self, name: str, value: str, *, tenant: str | None = None) -> int:
        key = secret_key(name, tenant)
        if not isinstance(value, str) or not value:
            raise SecretError(f"secret {name!r} must be a non-empty string")
        if len(value.encode()) > MAX_SECRET_BYTES:
            raise SecretError(f"secret {name!r} is over {MAX_SECRET_BYTES} bytes")
        sealed = self._box.encrypt(msgspec.json.encode(_Sealed(key=key, value=value)))
        return await self._kv.put(key, sealed)

    async def exists(self, name: str, *, tenant: str | None = None) -> bool:
        try:
            entry = await self._kv.get(secret_key(name, tenant))
        except KeyNotFoundError:
            return False
        return bool(entry.value)

    async def delete(self, name: str, *, tenant: str | None = None) -> None:
        await self._kv.delete(secret_key(name, tenant))


class SecretsReader(SecretsWriter):
    """The services' side: holds the private key and opens a secret when it is used."""

    def __init__(self, kv: KeyValue, private_key: PrivateKey) -> None:
        super().__init__(kv, private_key.public_key)
        self._opener = SealedBox(private_key)

    @classmethod
    async def open_reader(cls, js: JetStreamContext, private_key: PrivateKey) -> "SecretsReader":
        return cls(await js.key_value(streams.SECRETS.bucket), private_key)

    async def get(self, name: str, *, tenant: str | None = None) -> str:
        """The secret `name` in exactly this scope (a tenant's, or the global one)."""
        key = secret_key(name, tenant)
        scope = f"tenant {tenant}" if tenant is not None else "the global scope"
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            entry = None
        if entry is None or not entry.value:
            raise SecretNotFound(
                f"secret {name!r} is not stored in {scope}: store it through the gateway "
                "(a profile resolves secrets of its own scope only)"
            )
        try:
            sealed = msgspec.json.decode(self._opener.decrypt(entry.value), type=_Sealed)
        except (CryptoError, msgspec.DecodeError, msgspec.ValidationError):
            raise SecretRefused(
                f"secret {name!r} in {scope} does not open with the services' key: it was "
                "sealed to another key pair; store it again"
            ) from None
        if sealed.key != key:
            raise SecretRefused(
                f"secret {name!r} in {scope} was sealed under another name and copied here; "
                "it is refused: store it again under this name"
            )
        return sealed.value
