"""Resolving a tenant's address and judging it (`fleet_events.addresses`): the DNS half.

`check` is for threads (the agent's model calls run in dspy's), `acheck` for an event loop
(the gateway storing a profile). Both resolve the host once and refuse it when any address
is not public and not inside the deployment's `FLEET_EGRESS_ALLOW`. The model call then does
its own lookup (litellm dials by name): a name that changes its answer between the two
lookups (DNS rebinding) is a gap this check narrows but does not close; URL documents, which
the agent fetches itself, dial the address they checked (`fleet_agent.chat.urls`).
"""

import asyncio
import ipaddress
import os
import socket
from collections.abc import Mapping

from fleet_events.addresses import (
    ALLOW_ENV,
    IP,
    MODEL_SERVER,
    REPOSITORY,
    AddressRefused,
    host_of,
    parse_allow,
    refusal,
)  # fmt: skip
from fleet_events.git import remote_of


def allowed(
    env: Mapping[str, str] | None = None,
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return parse_allow((os.environ if env is None else env).get(ALLOW_ENV, ""))


def _addresses(infos: list[tuple[object, ...]]) -> list[IP]:
    return [ipaddress.ip_address(str(info[4][0])) for info in infos]  # type: ignore[index]


def _judged(
    url: str,
    host: str,
    infos: list[tuple[object, ...]] | None,
    env: Mapping[str, str] | None,
    field: str = "api_base",
    rule: str = MODEL_SERVER,
) -> IP:
    """The first address of `infos`, once every one is judged; AddressRefused naming why not."""
    if infos is None:
        raise AddressRefused(f"{field} {url[:200]!r}: its host {host!r} does not resolve")
    addresses = _addresses(infos)
    problem = refusal(url, addresses, allowed(env), field=field, rule=rule)
    if problem is not None:
        raise AddressRefused(problem)
    return addresses[0]


def check(url: str, env: Mapping[str, str] | None = None) -> None:
    host, port = host_of(url)
    try:
        infos: list[tuple[object, ...]] | None = list(
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        )
    except OSError:
        infos = None
    _judged(url, host, infos, env)


async def acheck(url: str, env: Mapping[str, str] | None = None) -> None:
    host, port = host_of(url)
    await ajudged(url, host, port, env=env)


async def ajudged(
    url: str,
    host: str,
    port: int,
    *,
    field: str = "api_base",
    rule: str = MODEL_SERVER,
    env: Mapping[str, str] | None = None,
) -> IP:
    """`host` (named by the tenant's `field`, `url`) resolved once, every address judged by
    `rule`; the first, to dial. AddressRefused naming why not."""
    loop = asyncio.get_running_loop()
    try:
        infos: list[tuple[object, ...]] | None = list(
            await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        )
    except OSError:
        infos = None
    return _judged(url, host, infos, env, field, rule)


__all__ = ["AddressRefused", "acheck", "allowed", "check"]


async def arepository(url: str, env: Mapping[str, str] | None = None) -> IP | None:
    """The address a remote repository URL's host resolves to, every address it answers
    judged by the repository rule (`REPOSITORY`); None for a local URL (tests only, and
    refused from clients by `fleet_events.git`). AddressRefused naming why not."""
    remote = remote_of(url)
    if remote is None:
        return None
    _, host, port = remote
    return await ajudged(url, host, port, field="repo_url", rule=REPOSITORY, env=env)
