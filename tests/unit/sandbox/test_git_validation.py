"""Refs and repository URLs a tenant may hand to git (providers/git.py). Messages are pinned
whole: they are what a caller reads to fix the request."""

import pytest

from fleet_sandbox_broker.errors import BadSpec
from fleet_sandbox_broker.providers.git import MAX_REF, MAX_URL, check_ref, check_repo_url

REF_HINT = "give a branch or tag name (git check-ref-format rules) or a commit id"
REMOTE = "use an https://, ssh:// or git:// URL"
LOCAL = "use an https://, ssh:// or git:// URL, a file:// URL or a local path"
TAIL = ". A local checkout is uploaded as context files, never read from the server's disk"


@pytest.mark.parametrize(
    "ref",
    ["main", "v1.2.3", "feature/x-y_z", "release+1", "a=b", "deadbee", "a" * 40, "0" * 64,
     "HEAD", "refs/heads/main", "a" * MAX_REF, "a.b", "x/y.lockx"],
)  # fmt: skip
def test_ref_names_and_commit_ids_pass(ref: str) -> None:
    assert check_ref(ref) == ref


def test_no_ref_means_the_default_branch() -> None:
    assert check_ref(None) is None


OPTION = "it starts with '-', which git would read as an option"
ALPHABET = "it holds a character outside letters, digits and . _ / + = -"
SLASHES = "a ref name cannot start or end with '/', end with '.' or contain '//'"


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("--pathspec-from-file=/etc/shadow", OPTION),
        ("-b", OPTION),
        ("-" + "0" * 40, OPTION),
        ("", "it is empty"),
        ("a" * (MAX_REF + 1), f"it is longer than {MAX_REF} characters"),
        ("main branch", ALPHABET),
        ("main\n", ALPHABET),
        ("ma~1", ALPHABET),
        ("ma^", ALPHABET),
        ("a:b", ALPHABET),
        ("a?", ALPHABET),
        ("a*", ALPHABET),
        ("a[b", ALPHABET),
        ("a\\b", ALPHABET),
        ("a@{1}", ALPHABET),
        ("@", ALPHABET),
        ("a..b", "it contains '..'"),
        ("/main", SLASHES),
        ("main/", SLASHES),
        ("main.", SLASHES),
        ("a//b", SLASHES),
        (".hidden", "its component '.hidden' starts with '.' or ends with '.lock'"),
        ("x/.hidden", "its component '.hidden' starts with '.' or ends with '.lock'"),
        ("main.lock", "its component 'main.lock' starts with '.' or ends with '.lock'"),
        ("x/y.lock/z", "its component 'y.lock' starts with '.' or ends with '.lock'"),
    ],
)
def test_refs_git_would_misread_are_refused_saying_why(ref: str, why: str) -> None:
    with pytest.raises(BadSpec) as caught:
        check_ref(ref)
    assert caught.value.message == f"ref {ref!r} is refused: {why}; {REF_HINT}"


@pytest.mark.parametrize(
    "url",
    ["https://example.org/a/b.git", "ssh://git@example.org/a.git", "git://10.0.0.1:9418/r",
     "https://[::1]:8443/r", "HTTPS://example.org/r", "https://e.org/" + "a" * (MAX_URL - 14),
     "ssh://git.user-1@h/r", "https://h:65535/r"],
)  # fmt: skip
def test_remote_urls_pass(url: str) -> None:
    assert check_repo_url(url, allow_local=False) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("--upload-pack=touch /tmp/x", OPTION),
        ("ext::sh -c touch% /tmp/x", "it contains whitespace or a control character"),
        ("https://e.org/a\x01", "it contains whitespace or a control character"),
        ("https://e.org/a\x7f", "it contains whitespace or a control character"),
        ("https://example.org/a\tb", "it contains whitespace or a control character"),
        ("ext::sh", "it is not a URL with a scheme (scp-like and transport:: forms are refused)"),
        (
            "git@example.org:a/b.git",
            "it is not a URL with a scheme (scp-like and transport:: forms are refused)",
        ),
        ("/srv/repo", "it is not a URL with a scheme (scp-like and transport:: forms are refused)"),
        ("file:///etc", "local repositories are not allowed on this server"),
        ("http://example.org/r", "the scheme 'http' is not allowed"),
        (
            "https://user:token@example.org/r",
            "it carries a password; credentials never travel in a repo URL",
        ),
        (
            "https://user:@example.org/r",
            "it carries a password; credentials never travel in a repo URL",
        ),
        ("ssh://-oProxyCommand=x@h/r", "the user name '-oProxyCommand=x' is not plain"),
        ("https://-x.org/r", "the host '-x.org' is not a host name or address"),
        ("https://.x.org/r", "the host '.x.org' is not a host name or address"),
        ("https://ex_ample.org/r", "the host 'ex_ample.org' is not a host name or address"),
        ("https:///r", "the host '' is not a host name or address"),
        ("https://example.org:port/r", "its port is not a number from 0 to 65535"),
        ("https://example.org:65536/r", "its port is not a number from 0 to 65535"),
        ("https://example.org", "it names no repository path"),
        ("https://example.org/", "it names no repository path"),
        ("", "it is empty"),
        ("https://e.org/" + "a" * (MAX_URL - 13), f"it is longer than {MAX_URL} characters"),
    ],
)
def test_urls_outside_the_allow_list_are_refused_saying_why(url: str, why: str) -> None:
    with pytest.raises(BadSpec) as caught:
        check_repo_url(url, allow_local=False)
    shown = url.replace(":token@", ":***@")  # a password is never echoed back
    assert caught.value.message == f"repo_url {shown!r} is refused: {why}; {REMOTE}{TAIL}"
    assert "token@" not in caught.value.message


def test_local_sources_only_where_allowed() -> None:
    assert check_repo_url("/srv/repo", allow_local=True) == "/srv/repo"
    assert check_repo_url("file:///srv/repo", allow_local=True) == "file:///srv/repo"
    for url, why in [
        ("relative/repo", "it is not a URL with a scheme"),
        ("/srv/a::b", "it is not a URL with a scheme"),
        ("-x", "it starts with '-'"),
    ]:
        with pytest.raises(BadSpec) as caught:
            check_repo_url(url, allow_local=True)
        assert caught.value.message.startswith(f"repo_url {url!r} is refused: {why}")
        assert caught.value.message.endswith(f"; {LOCAL}{TAIL}")
