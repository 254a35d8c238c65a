"""Which addresses a tenant's configuration may make the mesh call (issue 27, M2). Pure: the
caller resolves the name (DNS is I/O) and hands the addresses here.

A tenant's LLM profile names an `api_base` that the agent then calls with the tenant's
prompts; pointed at `localhost`, `2130706433` (127.0.0.1 as one number), a private range or
the cloud metadata address, it made the agent read the deployment's own network and hand the
answer back. So a tenant's address must resolve only to public addresses, unless the
deployment allows a range (`FLEET_EGRESS_ALLOW`: comma-separated CIDRs, the operator's
environment, never a tenant's setting). Profiles in the global scope are the operator's own
(the embedded model on loopback among them) and are not checked.
"""

import ipaddress
from urllib.parse import urlsplit

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_ENV = "FLEET_EGRESS_ALLOW"


class AddressRefused(ValueError):
    """An address a tenant gave reaches what it must not; the message says which and why."""


def kind_of(ip: IP) -> str | None:
    """Why an address is not public (None: it is)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # `::ffff:127.0.0.1` is judged as the IPv4 it carries
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link-local"  # the cloud metadata address, 169.254.169.254, is one
    if ip.is_multicast:
        return "multicast"
    if ip.is_private or not ip.is_global:
        return "private"
    return None


def parse_allow(text: str) -> tuple[Network, ...]:
    """`FLEET_EGRESS_ALLOW`'s ranges; a bad entry raises naming it (the operator's typo must
    not silently allow nothing, or everything)."""
    ranges: list[Network] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            ranges.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise AddressRefused(
                f"{ALLOW_ENV} entry {part[:60]!r} is not an address range: write CIDRs such as "
                "10.0.0.0/8, separated by commas"
            ) from None
    return tuple(ranges)


def host_of(url: str) -> tuple[str, int]:
    """The host and port a URL names; raises `AddressRefused` for one that names none."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise AddressRefused(f"api_base {url[:200]!r} must be an http:// or https:// address")
    host = parts.hostname or ""
    if not host:
        raise AddressRefused(f"api_base {url[:200]!r} names no host")
    try:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        raise AddressRefused(f"api_base {url[:200]!r}: its port is not a number") from None
    return host, port


MODEL_SERVER = (
    "a tenant's model server must be at a public address. Use the provider's public URL, or "
    f"ask the operator to serve it as a global profile (or to allow the range in {ALLOW_ENV})"
)
REPOSITORY = (
    "a repository must be at a public address. Use its public URL, or ask the operator to "
    f"allow the range in {ALLOW_ENV}"
)


def refusal(
    url: str,
    addresses: list[IP],
    allow: tuple[Network, ...] = (),
    *,
    field: str = "api_base",
    rule: str = MODEL_SERVER,
) -> str | None:
    """Why `url` (the tenant's `field`), whose host resolved to `addresses`, may not be dialled
    for a tenant (None: it may). Every address must be public or inside an allowed range: a
    name that answers one public and one private address could be dialled at either."""
    if not addresses:
        return f"{field} {url[:200]!r}: its host resolves to no address"
    for ip in addresses:
        kind = kind_of(ip)
        if kind is None or any(ip in net for net in allow if ip.version == net.version):
            continue
        host = urlsplit(url).hostname or ""
        shown = host if host == str(ip) else f"{host} ({ip})"
        return f"{field} {url[:200]!r} reaches {shown}, a {kind} address: {rule}"
    return None


__all__ = [
    "ALLOW_ENV", "IP", "MODEL_SERVER", "REPOSITORY", "AddressRefused", "host_of", "kind_of",
    "parse_allow", "refusal",
]  # fmt: skip
