"""What a tenant may ask git to fetch: repository URLs and refs, checked before git sees them.

The rules are pure and shared with the gateway, which refuses a bad turn's `repo_url` /
`repo_ref` before storing it: `fleet_events.git` (no leading `-`; refs by `git
check-ref-format` on a narrow alphabet or a commit id; URLs https/ssh/git, local paths and
file:// only where the broker allows local repositories, in tests). Here they raise `BadSpec`.

A remote URL's host must also resolve to public addresses only (or ones inside the
deployment's `FLEET_EGRESS_ALLOW`): the clone runs on the host network, so a tenant naming a
LAN host or the cloud metadata address would have the broker fetch from it. The clone is then
pinned to the address checked, with redirects refused (`pinned`; `workspace.clone`).
"""

from urllib.parse import urlsplit, urlunsplit

from fleet_events.git import (
    LOCAL_SCHEMES,
    MAX_REF,
    MAX_URL,
    PORTS,
    SCHEMES,
    ref_refusal,
    remote_of,
    repo_url_refusal,
)  # fmt: skip
from fleet_sandbox_broker.errors import BadSpec

__all__ = [
    "LOCAL_SCHEMES", "MAX_REF", "MAX_URL", "PORTS", "SCHEMES", "check_ref", "check_repo_url",
    "pinned", "remote_of",
]  # fmt: skip


def check_ref(ref: str | None) -> str | None:
    """`ref` if git can only read it as a ref name or a commit id; else BadSpec saying why."""
    if ref is None:
        return None
    why = ref_refusal(ref)
    if why is not None:
        raise BadSpec(why)
    return ref


def check_repo_url(url: str, *, allow_local: bool) -> str:
    """`url` if it names a remote repository over an allowed transport; else BadSpec."""
    why = repo_url_refusal(url, allow_local=allow_local)
    if why is not None:
        raise BadSpec(why)
    return url


def pinned(url: str, ip: str) -> tuple[str, dict[str, str]]:
    """The URL git is given and the environment it runs with, so that it dials `ip`, the
    address the policy checked, and nothing else: https keeps its name (TLS checks the
    certificate against it) with curl's resolution pinned; git:// and ssh:// are given the
    address itself. Redirects are refused either way (one to a private host would dodge the
    check: git follows the first request's by default)."""
    scheme, host, port = remote_of(url) or ("", "", 0)
    literal = f"[{ip}]" if ":" in ip else ip
    config = {"http.followRedirects": "false"}
    target = url
    if scheme == "https":
        config["http.curloptResolve"] = f"{host}:{port}:{literal}"
    elif scheme:
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        shown_port = f":{parts.port}" if parts.port else ""
        target = urlunsplit(parts._replace(netloc=f"{user}{literal}{shown_port}"))
    env = {"GIT_CONFIG_COUNT": str(len(config))}
    for n, (key, value) in enumerate(config.items()):
        env[f"GIT_CONFIG_KEY_{n}"], env[f"GIT_CONFIG_VALUE_{n}"] = key, value
    return target, env
