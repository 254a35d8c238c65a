"""What a tenant may ask git to fetch: repository URLs and refs, checked before git sees them.

Both reach a `git` command line, so a value git would read as an option
(`--pathspec-from-file=/etc/shadow`, `--upload-pack=...`) or a transport that runs a command
(`ext::`) must never get through. Refs follow git's own rules (`git check-ref-format`) on a
narrow alphabet, or are a commit id; URLs are https/ssh/git (local paths and file:// only
where the caller allows local repositories: the broker in tests). Pure functions: no I/O.

The gateway refuses a bad `repo_url` / `repo_ref` on a turn with these messages before it
stores anything; the sandbox broker checks again before it runs git (its `providers/git.py`).
"""

import re
from urllib.parse import urlsplit

SCHEMES = ("https", "ssh", "git")
LOCAL_SCHEMES = ("file",)
PORTS = {"https": 443, "ssh": 22, "git": 9418}
"""The remote transports' default ports."""


def remote_of(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a checked remote repository URL; None for a local one."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in PORTS:
        return None
    return scheme, parts.hostname or "", parts.port or PORTS[scheme]


MAX_REF = 255
MAX_URL = 2048

_SHA = re.compile(r"[0-9a-f]{7,64}")
_REF_CHARS = re.compile(r"[A-Za-z0-9._/+=-]+")
# a name or IPv4 address (never starting with '-' or '.'), or an IPv6 address (brackets gone)
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*|[0-9A-Fa-f]*:[0-9A-Fa-f:.]*")
_USER = re.compile(r"[A-Za-z0-9._-]+")

REF_HINT = "give a branch or tag name (git check-ref-format rules) or a commit id"


def ref_refusal(ref: str) -> str | None:
    """Why `ref` is refused (the whole sentence, naming the value and what to send), or None."""
    why = ref_problem(ref)
    return None if why is None else f"ref {ref!r} is refused: {why}; {REF_HINT}"


def repo_url_refusal(url: str, *, allow_local: bool) -> str | None:
    """Why `url` is refused (the whole sentence, naming the value and the transports allowed),
    or None."""
    why = url_problem(url, allow_local)
    if why is None:
        return None
    kinds = "an https://, ssh:// or git:// URL" + (
        ", a file:// URL or a local path" if allow_local else ""
    )
    return (
        f"repo_url {redacted(url)!r} is refused: {why}; use {kinds}. A local checkout is uploaded "
        "as context files, never read from the server's disk"
    )


def redacted(url: str) -> str:
    """`url` with any password in it replaced by `***`, fit to show or log."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return url
    return url if not password else url.replace(f":{password}@", ":***@", 1)


def ref_problem(ref: str) -> str | None:
    """The rule `ref` breaks, or None when git can only read it as a ref name or commit id."""
    if not ref:
        return "it is empty"
    if len(ref) > MAX_REF:
        return f"it is longer than {MAX_REF} characters"
    if ref.startswith("-"):
        return "it starts with '-', which git would read as an option"
    if _SHA.fullmatch(ref):
        return None
    if not _REF_CHARS.fullmatch(ref):
        return "it holds a character outside letters, digits and . _ / + = -"
    if ".." in ref:
        return "it contains '..'"
    if ref.startswith("/") or ref.endswith(("/", ".")) or "//" in ref:
        return "a ref name cannot start or end with '/', end with '.' or contain '//'"
    for part in ref.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return f"its component {part!r} starts with '.' or ends with '.lock'"
    return None


def url_problem(url: str, allow_local: bool) -> str | None:
    """The rule `url` breaks, or None when it names a repository over an allowed transport."""
    if not url:
        return "it is empty"
    if len(url) > MAX_URL:
        return f"it is longer than {MAX_URL} characters"
    if url.startswith("-"):
        return "it starts with '-', which git would read as an option"
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return "it contains whitespace or a control character"
    if "://" not in url:
        if allow_local and url.startswith("/") and "::" not in url:
            return None
        return "it is not a URL with a scheme (scp-like and transport:: forms are refused)"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in LOCAL_SCHEMES:
        return None if allow_local else "local repositories are not allowed on this server"
    if scheme not in SCHEMES:
        return f"the scheme {scheme!r} is not allowed"
    if parts.password is not None:
        return "it carries a password; credentials never travel in a repo URL"
    if parts.username is not None and not _USER.fullmatch(parts.username):
        return f"the user name {parts.username!r} is not plain"
    host = parts.hostname or ""
    if not _HOST.fullmatch(host):
        return f"the host {host!r} is not a host name or address"
    try:
        parts.port  # noqa: B018 - urlsplit checks the port when it is read
    except ValueError:
        return "its port is not a number from 0 to 65535"
    if parts.path in ("", "/"):
        return "it names no repository path"
    return None
