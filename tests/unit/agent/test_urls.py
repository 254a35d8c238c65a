"""URL loading for the chat agent's documents: public addresses only, checked at every hop,
connected to as checked.

Every test host is loopback, so the one test server here stands in for "a public site" only
through the loader's named seams: `admit` (which addresses count as public), `resolve` (what a
name resolves to) and `connect` (what the loader dials). The refusals run with the default
`admit` and a `connect` that fails the test if it is ever called.
"""

import http.server
import ipaddress
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from fleet_agent.chat.urls import MAX_BYTES, MAX_REDIRECTS, UrlLoader, UrlRefused, public_only

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass
class Site:
    """A loopback HTTP server that records the paths it was asked for."""

    port: int = 0
    hits: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(site: Site) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            site.hits.append(self.path)
            path, _, query = self.path.partition("?")
            if path == "/text":
                self._send(200, b"hello public world", {"Content-Type": "text/plain"})
            elif path == "/host":
                host = self.headers.get("Host", "")
                self._send(200, host.encode(), {"Content-Type": "text/plain"})
            elif path == "/redirect":
                self._send(302, b"", {"Location": query.removeprefix("to=")})
            elif path.startswith("/chain/"):
                left = int(path.rsplit("/", 1)[1])
                if left == 0:
                    self._send(200, b"end of chain", {"Content-Type": "text/plain"})
                else:
                    self._send(301, b"", {"Location": f"/chain/{left - 1}"})
            elif path == "/big-declared":
                self.send_response(200)
                self.send_header("Content-Length", str(MAX_BYTES + 1))
                self.end_headers()
            elif path == "/big-undeclared":
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                block = b"x" * 65536
                try:
                    for _ in range(MAX_BYTES // len(block) + 2):
                        self.wfile.write(block)
                except OSError:
                    pass  # the loader hung up once it had seen enough: what the test wants
                self.close_connection = True
            elif path == "/stall":
                site.release.wait(30)
            else:
                self._send(404, b"no such page", {})

    return Handler


@pytest.fixture
def site() -> Iterator[Site]:
    state = Site()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()


def never_connect(ip: IP, port: int, timeout: float) -> socket.socket:
    raise AssertionError(f"the loader dialled {ip}:{port}, which it should have refused")


def this_site_is_public(ip: IP) -> bool:
    """The seam for the success path: the loopback test server counts as public, nothing
    else loopback, private or link-local does."""
    return ip == ipaddress.ip_address("127.0.0.1") or public_only(ip)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:{port}/text", "loopback"),
        ("http://localhost:{port}/text", "loopback"),
        ("http://[::1]:{port}/text", "loopback"),
        ("http://127.7.7.7:{port}/text", "loopback"),
        ("http://0.0.0.0:{port}/text", "unspecified"),
        ("http://[::ffff:127.0.0.1]:{port}/text", "loopback"),
    ],
)
def test_loopback_targets_are_refused_and_never_reached(site: Site, url: str, kind: str) -> None:
    with pytest.raises(UrlRefused) as refused:
        UrlLoader().fetch(url.format(port=site.port))
    assert kind in str(refused.value)
    assert "only public internet addresses" in str(refused.value)
    assert site.hits == []


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://10.0.0.5/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://172.16.3.4/", "private"),
        ("http://100.64.0.1/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[fd00::1]/", "private"),
    ],
)
def test_private_and_link_local_targets_are_refused_before_any_connect(url: str, kind: str) -> None:
    with pytest.raises(UrlRefused) as refused:
        UrlLoader(connect=never_connect).fetch(url)
    assert kind in str(refused.value)


def test_a_name_with_any_private_address_is_refused() -> None:
    """A name that resolves to a public and a private address could be dialled at either."""

    def resolve(host: str, port: int) -> list[IP]:
        return [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.1.2.3")]

    with pytest.raises(UrlRefused) as refused:
        UrlLoader(resolve=resolve, connect=never_connect).fetch("http://mixed.example/")
    assert "10.1.2.3" in str(refused.value)
    assert "mixed.example" in str(refused.value)


def test_a_redirect_to_link_local_is_refused_after_the_public_hop(site: Site) -> None:
    dialled: list[str] = []

    def connect(ip: IP, port: int, timeout: float) -> socket.socket:
        dialled.append(str(ip))
        return socket.create_connection((str(ip), port), timeout)

    loader = UrlLoader(admit=this_site_is_public, connect=connect)
    target = "http://169.254.169.254/latest/meta-data/"
    with pytest.raises(UrlRefused) as refused:
        loader.fetch(f"{site.base}/redirect?to={target}")
    assert "link-local" in str(refused.value)
    assert "redirect" in str(refused.value)
    assert dialled == ["127.0.0.1"]  # the first hop only


def test_a_redirect_to_a_name_that_resolves_private_is_refused(site: Site) -> None:
    def resolve(host: str, port: int) -> list[IP]:
        if host == "internal.example":
            return [ipaddress.ip_address("10.9.8.7")]
        return [ipaddress.ip_address(host)]

    loader = UrlLoader(admit=this_site_is_public, resolve=resolve)
    with pytest.raises(UrlRefused) as refused:
        loader.fetch(f"{site.base}/redirect?to=http://internal.example/secrets")
    assert "10.9.8.7" in str(refused.value)
    assert site.hits == ["/redirect?to=http://internal.example/secrets"]


def test_it_connects_to_the_address_it_checked_not_a_second_lookup(site: Site) -> None:
    """DNS rebinding: the name answers a public address when checked and loopback on the next
    lookup. The loader must dial what it checked (here the seam carries that public address to
    the test server) and never look the name up again."""
    lookups: list[str] = []
    dialled: list[str] = []
    answers = iter(["93.184.216.34", "127.0.0.1", "127.0.0.1", "127.0.0.1"])

    def rebinding(host: str, port: int) -> list[IP]:
        lookups.append(host)
        return [ipaddress.ip_address(next(answers))]

    def connect(ip: IP, port: int, timeout: float) -> socket.socket:
        dialled.append(str(ip))
        assert str(ip) == "93.184.216.34", "dialled an address that was never checked"
        return socket.create_connection(("127.0.0.1", site.port), timeout)

    fetched = UrlLoader(resolve=rebinding, connect=connect).fetch(
        f"http://rebind.example:{site.port}/host"
    )
    assert lookups == ["rebind.example"]
    assert dialled == ["93.184.216.34"]
    assert fetched.address == "93.184.216.34"
    assert fetched.body == f"rebind.example:{site.port}".encode()  # the name, not the address


def test_the_success_path_returns_the_body_and_its_type(site: Site) -> None:
    fetched = UrlLoader(admit=this_site_is_public).fetch(f"{site.base}/text")
    assert fetched.status == 200
    assert fetched.body == b"hello public world"
    assert fetched.media_type == "text/plain"
    assert fetched.final_url == f"{site.base}/text"


def test_five_redirects_are_followed_and_a_sixth_is_refused(site: Site) -> None:
    loader = UrlLoader(admit=this_site_is_public)
    fetched = loader.fetch(f"{site.base}/chain/{MAX_REDIRECTS}")
    assert fetched.body == b"end of chain"
    assert len(fetched.redirects) == MAX_REDIRECTS
    with pytest.raises(UrlRefused) as refused:
        loader.fetch(f"{site.base}/chain/{MAX_REDIRECTS + 1}")
    assert f"more than {MAX_REDIRECTS} redirects" in str(refused.value)


@pytest.mark.parametrize("path", ["/big-declared", "/big-undeclared"])
def test_bodies_over_ten_mib_are_refused(site: Site, path: str) -> None:
    with pytest.raises(UrlRefused) as refused:
        UrlLoader(admit=this_site_is_public).fetch(f"{site.base}{path}")
    assert "10 MiB" in str(refused.value)


def test_a_server_that_stalls_is_given_up_on(site: Site) -> None:
    loader = UrlLoader(admit=this_site_is_public, read_timeout_s=0.3)
    with pytest.raises(UrlRefused) as refused:
        loader.fetch(f"{site.base}/stall")
    assert "did not answer" in str(refused.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("file:///etc/passwd", "scheme 'file'"),
        ("ftp://example.com/x", "scheme 'ftp'"),
        ("http:///nohost", "no host"),
        ("not a url", "scheme ''"),
    ],
)
def test_urls_that_are_not_web_addresses_are_refused(url: str, expected: str) -> None:
    with pytest.raises(UrlRefused) as refused:
        UrlLoader(connect=never_connect).fetch(url)
    assert expected in str(refused.value)


def test_credentials_in_a_url_are_refused_without_being_echoed() -> None:
    with pytest.raises(UrlRefused) as refused:
        UrlLoader(connect=never_connect).fetch("http://admin:hunter2-secret@example.com/")
    assert "hunter2-secret" not in str(refused.value)
    assert "credentials" in str(refused.value)
