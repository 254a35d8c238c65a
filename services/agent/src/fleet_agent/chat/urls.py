"""Fetching a document from a URL without letting the model reach what it must not.

A URL the model (or a user) names may point at the agent's own network: loopback, the private
ranges, the cloud metadata address (link-local), or a name that resolves there, directly or
through a redirect, or only on a second lookup (DNS rebinding). So at every hop the host is
resolved once, every address it resolves to must be public, and the connection is made to the
address that was checked — the name is never looked up again by anything else. Redirects are
followed here, by hand, at most `MAX_REDIRECTS`; bodies stop at `MAX_BYTES`; connect and read
have timeouts, and the whole fetch a deadline. No proxy from the environment is used: a proxy
would do its own lookup, which is exactly the check being bypassed.

`resolve`, `connect` and `admit` are the named seams: tests (whose only host is loopback) use
them to make a loopback server stand in for a public one, and to see what was dialled.
"""

import http.client
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from fleet_agent.run.failures import InputError
from fleet_events.addresses import kind_of

IP = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_BYTES = 10 * 1024 * 1024
MAX_REDIRECTS = 5
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 20.0
REDIRECTS = frozenset({301, 302, 303, 307, 308})
CHUNK = 64 * 1024

Resolve = Callable[[str, int], list[IP]]
Connect = Callable[[IP, int, float], socket.socket]
Admit = Callable[[IP], bool]


class UrlRefused(InputError):
    """The URL was not fetched; the message says which part was wrong and what to do."""


def system_resolve(host: str, port: int) -> list[IP]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0]) for info in infos]


def tcp_connect(ip: IP, port: int, timeout: float) -> socket.socket:
    return socket.create_connection((str(ip), port), timeout=timeout)


def public_only(ip: IP) -> bool:
    return kind_of(ip) is None


@dataclass(frozen=True)
class Fetched:
    url: str
    final_url: str
    status: int
    media_type: str
    body: bytes
    address: str
    """The address the body came from: the one that was checked."""
    redirects: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    path: str


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UrlRefused(
            f"cannot load {url[:200]!r}: scheme {scheme!r} is not supported; give an http:// "
            "or https:// address, or upload the file"
        )
    if parts.username is not None or parts.password is not None:
        raise UrlRefused(
            "cannot load a URL that carries credentials (user:password@): remove them; "
            "documents are loaded from public addresses only"
        )
    host = parts.hostname or ""
    if not host:
        raise UrlRefused(f"cannot load {url[:200]!r}: it names no host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise UrlRefused(f"cannot load {url[:200]!r}: its port is not a number") from None
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return _Target(scheme=scheme, host=host, port=port, path=path)


class UrlLoader:
    def __init__(
        self,
        *,
        resolve: Resolve = system_resolve,
        connect: Connect = tcp_connect,
        admit: Admit = public_only,
        max_bytes: int = MAX_BYTES,
        max_redirects: int = MAX_REDIRECTS,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self._resolve = resolve
        self._connect = connect
        self._admit = admit
        self._max_bytes = max_bytes
        self._max_redirects = max_redirects
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s

    def fetch(self, url: str) -> Fetched:
        redirects: list[str] = []
        current = url
        deadline = time.monotonic() + self._connect_timeout + self._read_timeout
        while True:
            target = _target(current)
            ip = self._checked_address(target, via_redirect=bool(redirects))
            status, location, media_type, body = self._get(target, ip, deadline, current)
            if status in REDIRECTS and location:
                if len(redirects) >= self._max_redirects:
                    raise UrlRefused(
                        f"cannot load {url[:200]!r}: more than {self._max_redirects} redirects; "
                        "give the final address instead"
                    )
                redirects.append(current)
                current = urljoin(current, location)
                continue
            if status >= 400:
                raise UrlRefused(f"{current[:200]!r} answered HTTP {status}: nothing was loaded")
            return Fetched(
                url=url, final_url=current, status=status, media_type=media_type,
                body=body, address=str(ip), redirects=tuple(redirects),
            )  # fmt: skip

    def _checked_address(self, target: _Target, *, via_redirect: bool) -> IP:
        """Every address the host resolves to must be admitted (a name answering one public
        and one private address could be dialled at either); the first is the one dialled."""
        how = " (reached through a redirect)" if via_redirect else ""
        try:
            literal: IP | None = ipaddress.ip_address(target.host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [literal]
        else:
            try:
                addresses = self._resolve(target.host, target.port)
            except OSError:
                raise UrlRefused(
                    f"cannot load from {target.host!r}{how}: the name does not resolve"
                ) from None
        if not addresses:
            raise UrlRefused(f"cannot load from {target.host!r}{how}: the name has no address")
        for ip in addresses:
            if not self._admit(ip):
                kind = kind_of(ip) or "refused"
                raise UrlRefused(
                    f"cannot load from {target.host!r}{how}: it resolves to {ip}, a {kind} "
                    "address; only public internet addresses can be loaded (upload the file "
                    "instead)"
                )
        return addresses[0]

    def _get(
        self, target: _Target, ip: IP, deadline: float, url: str
    ) -> tuple[int, str, str, bytes]:
        try:
            sock = self._connect(ip, target.port, self._connect_timeout)
        except OSError as exc:
            raise UrlRefused(
                f"cannot connect to {target.host!r} ({ip}): {type(exc).__name__}"
            ) from None
        conn: http.client.HTTPConnection | None = None
        response: http.client.HTTPResponse | None = None
        try:
            sock.settimeout(self._read_timeout)
            if target.scheme == "https":
                context = ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=target.host)
                conn = http.client.HTTPSConnection(target.host, target.port)
            else:
                conn = http.client.HTTPConnection(target.host, target.port)
            conn.sock = sock  # dial nothing else: this is the checked address's socket
            conn.request("GET", target.path, headers={"Accept-Encoding": "identity"})
            response = conn.getresponse()
            location = response.getheader("Location") or ""
            media_type = (response.getheader("Content-Type") or "").split(";")[0].strip()
            if response.status in REDIRECTS:
                return response.status, location, media_type, b""
            declared = response.getheader("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > self._max_bytes:
                raise UrlRefused(self._too_big(url))
            body = bytearray()
            while True:
                if time.monotonic() > deadline:
                    raise UrlRefused(f"{url[:200]!r} did not answer in time: nothing was loaded")
                piece = response.read(CHUNK)
                if not piece:
                    break
                body += piece
                if len(body) > self._max_bytes:
                    raise UrlRefused(self._too_big(url))
            return response.status, location, media_type, bytes(body)
        except TimeoutError:
            raise UrlRefused(f"{url[:200]!r} did not answer in time: nothing was loaded") from None
        except ssl.SSLError as exc:
            raise UrlRefused(
                f"{url[:200]!r}: TLS failed ({exc.reason}): nothing was loaded"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise UrlRefused(
                f"{url[:200]!r} could not be read ({type(exc).__name__}): nothing was loaded"
            ) from None
        finally:
            # the response's file object holds the socket open on its own: close both
            if response is not None:
                response.close()
            if conn is not None:
                conn.close()
            sock.close()

    def _too_big(self, url: str) -> str:
        mib = self._max_bytes / (1024 * 1024)
        return (
            f"{url[:200]!r} is larger than {mib:g} MiB: nothing was loaded; for a bigger "
            "document, upload it or put it in the sandbox and hand it to the RLM"
        )
