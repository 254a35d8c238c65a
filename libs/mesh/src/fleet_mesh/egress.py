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

from fleet_events.addresses import ALLOW_ENV, IP, AddressRefused, host_of, parse_allow, refusal


def allowed(
    env: Mapping[str, str] | None = None,
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return parse_allow((os.environ if env is None else env).get(ALLOW_ENV, ""))


def _addresses(infos: list[tuple[object, ...]]) -> list[IP]:
    return [ipaddress.ip_address(str(info[4][0])) for info in infos]  # type: ignore[index]


def _judged(
    url: str, host: str, infos: list[tuple[object, ...]] | None, env: Mapping[str, str] | None
) -> None:
    if infos is None:
        raise AddressRefused(f"api_base {url[:200]!r}: its host {host!r} does not resolve")
    problem = refusal(url, _addresses(infos), allowed(env))
    if problem is not None:
        raise AddressRefused(problem)


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
    loop = asyncio.get_running_loop()
    try:
        infos: list[tuple[object, ...]] | None = list(
            await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        )
    except OSError:
        infos = None
    _judged(url, host, infos, env)


__all__ = ["AddressRefused", "acheck", "allowed", "check"]
