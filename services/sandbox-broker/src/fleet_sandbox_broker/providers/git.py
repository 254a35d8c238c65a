"""What a tenant may ask git to fetch: repository URLs and refs, checked before git sees them.

The rules are pure and shared with the gateway, which refuses a bad turn's `repo_url` /
`repo_ref` before storing it: `fleet_events.git` (no leading `-`; refs by `git
check-ref-format` on a narrow alphabet or a commit id; URLs https/ssh/git, local paths and
file:// only where the broker allows local repositories, in tests). Here they raise `BadSpec`.
"""

from fleet_events.git import LOCAL_SCHEMES, MAX_REF, MAX_URL, SCHEMES, ref_refusal, repo_url_refusal
from fleet_sandbox_broker.errors import BadSpec

__all__ = ["LOCAL_SCHEMES", "MAX_REF", "MAX_URL", "SCHEMES", "check_ref", "check_repo_url"]


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
