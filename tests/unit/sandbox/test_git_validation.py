"""Refs and repository URLs a tenant may hand to git (providers/git.py)."""

import pytest

from fleet_sandbox_broker.errors import BadSpec
from fleet_sandbox_broker.providers.git import check_ref, check_repo_url


@pytest.mark.parametrize(
    "ref",
    ["main", "v1.2.3", "feature/x-y_z", "release+1", "a=b", "deadbee", "a" * 40, "0" * 64,
     "HEAD", "refs/heads/main"],
)  # fmt: skip
def test_ref_names_and_commit_ids_pass(ref: str) -> None:
    assert check_ref(ref) == ref


def test_no_ref_means_the_default_branch() -> None:
    assert check_ref(None) is None


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("--pathspec-from-file=/etc/shadow", "starts with '-'"),
        ("-b", "starts with '-'"),
        ("", "empty"),
        ("a" * 256, "longer than 255"),
        ("main branch", "character outside"),
        ("main\n", "character outside"),
        ("ma~1", "character outside"),
        ("ma^", "character outside"),
        ("a:b", "character outside"),
        ("a?", "character outside"),
        ("a*", "character outside"),
        ("a[b", "character outside"),
        ("a\\b", "character outside"),
        ("a@{1}", "character outside"),
        ("a..b", "'..'"),
        ("@", "character outside"),
        ("/main", "start or end with '/'"),
        ("main/", "start or end with '/'"),
        ("main.", "end with '.'"),
        ("a//b", "'//'"),
        (".hidden", "starts with '.'"),
        ("x/.hidden", "starts with '.'"),
        ("main.lock", "ends with '.lock'"),
        ("x/y.lock/z", "ends with '.lock'"),
    ],
)
def test_refs_git_would_misread_are_refused_saying_why(ref: str, why: str) -> None:
    with pytest.raises(BadSpec) as caught:
        check_ref(ref)
    assert why in caught.value.message
    assert repr(ref) in caught.value.message
    assert "branch or tag name" in caught.value.message


@pytest.mark.parametrize(
    "url",
    ["https://example.org/a/b.git", "ssh://git@example.org/a.git", "git://10.0.0.1:9418/r",
     "https://[::1]:8443/r", "HTTPS://example.org/r"],
)  # fmt: skip
def test_remote_urls_pass(url: str) -> None:
    assert check_repo_url(url, allow_local=False) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("--upload-pack=touch /tmp/x", "starts with '-'"),
        ("ext::sh -c touch% /tmp/x", "whitespace"),
        ("ext::sh", "not a URL with a scheme"),
        ("git@example.org:a/b.git", "not a URL with a scheme"),
        ("/srv/repo", "not a URL with a scheme"),
        ("file:///etc", "local repositories are not allowed"),
        ("http://example.org/r", "scheme 'http' is not allowed"),
        ("fd::17", "not a URL with a scheme"),
        ("https://user:token@example.org/r", "password"),
        ("https://-oProxyCommand=x/r", "host"),
        ("ssh://-oProxyCommand=x@h/r", "user name"),
        ("https://ex_ample.org/r", "host"),
        ("https://example.org:port/r", "port"),
        ("https://example.org", "no repository path"),
        ("https://example.org/", "no repository path"),
        ("https://example.org/a\tb", "whitespace"),
        ("", "empty"),
        ("https://e.org/" + "a" * 2048, "longer than 2048"),
    ],
)
def test_urls_outside_the_allow_list_are_refused_saying_why(url: str, why: str) -> None:
    with pytest.raises(BadSpec) as caught:
        check_repo_url(url, allow_local=False)
    assert why in caught.value.message
    assert "https://, ssh:// or git://" in caught.value.message


def test_local_sources_only_where_allowed() -> None:
    assert check_repo_url("/srv/repo", allow_local=True) == "/srv/repo"
    assert check_repo_url("file:///srv/repo", allow_local=True) == "file:///srv/repo"
    with pytest.raises(BadSpec, match="not a URL with a scheme"):
        check_repo_url("relative/repo", allow_local=True)
    with pytest.raises(BadSpec, match="a file:// URL or a local path"):
        check_repo_url("-x", allow_local=True)
