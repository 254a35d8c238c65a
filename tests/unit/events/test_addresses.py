"""Which addresses a tenant's model server may have (issue 27, M2): public ones, or a range
the deployment allows. Pure: the addresses are given as DNS would answer them."""

import ipaddress
import re

import pytest

from fleet_events.addresses import AddressRefused, host_of, kind_of, parse_allow, refusal


def ips(*text: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [ipaddress.ip_address(t) for t in text]


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped: judged as the IPv4 it carries
        ("10.1.2.3", "private"),
        ("172.16.0.9", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),  # carrier-grade NAT: not global
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("fc00::1", "private"),
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
    ],
)
def test_each_address_is_public_or_says_what_it_is(address: str, kind: str | None) -> None:
    assert kind_of(ipaddress.ip_address(address)) == kind


def test_a_url_is_refused_when_any_address_it_resolves_to_is_not_public() -> None:
    url = "https://llm.example.com/v1"
    assert refusal(url, ips("8.8.8.8")) is None
    said = refusal(url, ips("8.8.8.8", "10.0.0.5"))  # one public, one private: either dialled
    assert said is not None
    assert "llm.example.com (10.0.0.5), a private address" in said
    assert "FLEET_EGRESS_ALLOW" in said
    # 2130706433 is 127.0.0.1 written as one number: DNS answers loopback, and so do we
    assert "a loopback address" in (refusal("http://2130706433:8080/v1", ips("127.0.0.1")) or "")
    assert refusal(url, []) == f"api_base {url!r}: its host resolves to no address"


def test_the_deployments_ranges_allow_what_they_name_only() -> None:
    allow = parse_allow("10.0.0.0/8, 127.0.0.1/32")
    assert refusal("http://x/v1", ips("10.9.9.9"), allow) is None
    assert refusal("http://x/v1", ips("127.0.0.1"), allow) is None
    assert refusal("http://x/v1", ips("127.0.0.2"), allow) is not None
    assert refusal("http://x/v1", ips("::1"), allow) is not None  # another family
    assert parse_allow("") == ()
    with pytest.raises(AddressRefused, match=re.escape("'10.0.0.0/33' is not an address range")):
        parse_allow("10.0.0.0/33")


def test_a_url_names_an_http_host() -> None:
    assert host_of("https://api.example.com/v1") == ("api.example.com", 443)
    assert host_of("http://10.0.0.1:8080") == ("10.0.0.1", 8080)
    for bad, why in [
        ("file:///etc/passwd", "http:// or https://"),
        ("http:///v1", "names no host"),
        ("http://h:port/v1", "port is not a number"),
    ]:
        with pytest.raises(AddressRefused, match=why):
            host_of(bad)
