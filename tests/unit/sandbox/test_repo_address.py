"""Issue 27 item 2: a repository URL reaches public addresses only. The broker clones on the
host network, so `repo_url=https://169.254.169.254/...` (the cloud metadata address) or a LAN
host was fetched for the tenant. Now the host is resolved and judged before git runs, and git
is pinned to the address judged, with redirects refused."""

import subprocess
from pathlib import Path

import pytest

from fleet_events.addresses import ALLOW_ENV
from fleet_sandbox_broker.errors import BadSpec
from fleet_sandbox_broker.providers.git import pinned, remote_of
from fleet_sandbox_broker.providers.workspace import clone, public_address


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("https://127.0.0.1/r.git", "a loopback address"),
        ("https://localhost/r.git", "a loopback address"),
        ("https://169.254.169.254/latest/r.git", "a link-local address"),
        ("git://10.1.2.3/r.git", "a private address"),
        ("ssh://git@[::1]:2222/r.git", "a loopback address"),
    ],
)
async def test_a_repository_at_an_internal_address_is_refused_before_git_runs(
    url: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)  # the suite allows loopback for its fakes
    with pytest.raises(BadSpec, match=kind) as refused:
        await clone(tmp_path, 1, url, None, allow_local=False, staging=tmp_path / "staging")
    assert "a repository must be at a public address" in str(refused.value)
    assert ALLOW_ENV in str(refused.value)  # says what the operator can do
    assert not (tmp_path / "repo").exists()


async def test_an_unresolvable_host_is_named() -> None:
    with pytest.raises(BadSpec, match=r"its host 'no-such-host\.invalid' does not resolve"):
        await public_address("https://no-such-host.invalid/r.git")


async def test_the_operators_allow_list_admits_a_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_ENV, "10.0.0.0/8")
    assert await public_address("git://10.1.2.3/r.git") == "10.1.2.3"
    with pytest.raises(BadSpec, match="loopback"):
        await public_address("git://127.0.0.1/r.git")


def test_https_keeps_its_name_and_pins_curl_git_and_ssh_dial_the_address() -> None:
    url, env = pinned("https://example.org/r.git", "93.184.216.34")
    assert url == "https://example.org/r.git"  # TLS checks the certificate against the name
    assert env == {
        "GIT_CONFIG_COUNT": "2",
        "GIT_CONFIG_KEY_0": "http.followRedirects", "GIT_CONFIG_VALUE_0": "false",
        "GIT_CONFIG_KEY_1": "http.curloptResolve",
        "GIT_CONFIG_VALUE_1": "example.org:443:93.184.216.34",
    }  # fmt: skip
    assert pinned("https://example.org:8443/r.git", "2001:db8::1")[1]["GIT_CONFIG_VALUE_1"] == (
        "example.org:8443:[2001:db8::1]"
    )
    assert pinned("git://example.org/r.git", "93.184.216.34")[0] == "git://93.184.216.34/r.git"
    assert pinned("ssh://git@example.org:2222/r.git", "2001:db8::1")[0] == (
        "ssh://git@[2001:db8::1]:2222/r.git"
    )
    assert remote_of("file:///srv/r") is None


def test_git_reads_the_pinned_settings_from_its_environment() -> None:
    _, env = pinned("https://example.org/r.git", "93.184.216.34")
    base = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"}
    for key, want in (("http.followRedirects", "false"), ("http.curloptResolve", None)):
        got = subprocess.run(
            ["git", "config", "--get", key], env={**base, **env}, capture_output=True, text=True,
            check=True,
        ).stdout.strip()  # fmt: skip
        assert got == (want or "example.org:443:93.184.216.34")
