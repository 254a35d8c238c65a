"""A local sandbox's files on the host: its directories, fork copies, clones, removal, and
the count of what it holds.

`<root>/<id>/` is root's (0711) and holds `runner.py`; `workspace/` and `tmp/` (0700) belong
to the sandbox's uid. Anything that writes where sandbox code can write (a fork's copy, a
clone) runs as that uid, never as root.
"""

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

from fleet_events.addresses import AddressRefused
from fleet_mesh import egress
from fleet_sandbox_broker.errors import BadSpec, ForkFailed
from fleet_sandbox_broker.providers.git import check_ref, check_repo_url, pinned, remote_of
from fleet_sandbox_broker.providers.uids import chown_tree

log = logging.getLogger("fleet.sandbox.local")

# what runs inside a sandbox (stdlib only), copied into each sandbox's root-owned directory
RUNNER_FILES = tuple(Path(__file__).with_name(name) for name in ("runner.py", "confine.py"))

# Clones into a sandbox's workspace as its uid. $1 workspace, $2 a bundle of a local source
# or "", $3 uid, $4 URL, $5 ref (already checked: never an option). The workspace and the
# bundle are opened before /tmp is covered, then shown at /tmp/ws and /tmp/src.bundle.
# `checkout` takes the ref as a positional: git 2.39's checkout reads `--end-of-options` as a
# second ref, so what keeps a ref from being an option is `check_ref` (no leading '-').
CLONE_SH = """set -e
WS="$1"; BUNDLE="$2"; U="$3"; URL="$4"; REF="$5"
exec 8<"$WS"
if [ -n "$BUNDLE" ]; then exec 9<"$BUNDLE"; fi
mount -t tmpfs -o size=64k,mode=755 tmpfs /tmp
mkdir /tmp/ws
mount --bind /proc/self/fd/8 /tmp/ws
if [ -n "$BUNDLE" ]; then
  : > /tmp/src.bundle
  mount --bind /proc/self/fd/9 /tmp/src.bundle
  URL=/tmp/src.bundle
  exec 9<&-
fi
exec 8<&-
as_uid() {
  setpriv --reuid="$U" --regid="$U" --clear-groups --no-new-privs --bounding-set=-all \\
    --inh-caps=-all "$@"
}
cd /tmp/ws
as_uid git clone --quiet --no-checkout -- "$URL" /tmp/ws/repo
as_uid git -C /tmp/ws/repo checkout --quiet "$REF" --
"""
GIT_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_TERMINAL_PROMPT": "0",
           "GIT_CONFIG_NOSYSTEM": "1", "LANG": "C"}  # fmt: skip
CLONE_TIMEOUT_S = 300


def make_dirs(directory: Path, uid: int, mountpoints: list[str], revive: bool) -> None:
    """`<root>/<id>`: root-owned 0711 holding the runner; `workspace/` and `tmp/` (0700) are
    the uid's, the only places the sandbox writes. A revive hands existing files to `uid`."""
    directory.mkdir(mode=0o700, exist_ok=revive)
    for sub in ("workspace", "tmp"):
        (directory / sub).mkdir(mode=0o700, exist_ok=revive)
    for target in mountpoints:
        (directory / "workspace" / target).mkdir(mode=0o700, parents=True, exist_ok=True)
    chown_tree(directory / "workspace", uid)
    chown_tree(directory / "tmp", uid)
    for source in RUNNER_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(directory / source.name, 0o600)
    install_runner(directory)
    os.chmod(directory, 0o711)  # noqa: S103 - traversable only


def prepare_child_dirs(directory: Path, uid: int, placed: bool = False) -> None:
    """What a forked child needs before it starts: its workspace and tmp, empty. `placed`:
    its directory is made already, in its family's filesystem (`disks.FamilyDisks.place`)."""
    if not placed:
        directory.mkdir(mode=0o711)
    for sub in ("workspace", "tmp"):
        (directory / sub).mkdir(mode=0o700)
        os.chown(directory / sub, uid, uid)


async def copy_sandbox_dir(source: Path, target: Path, uid: int) -> None:
    """Merge `source`'s workspace and tmp into the prepared `target` (modes kept, reflinks
    if the filesystem has them), AS THE SANDBOX'S UID: the target is writable by that uid
    (and so by its family's code), which may plant links there; run as the uid, a copy
    that follows one can only write where the sandbox could already write itself."""
    for sub in ("workspace", "tmp"):
        # both named by fd: the uid need not traverse the host path above the sandboxes,
        # and root-owned 0711 parents keep `workspace` and `tmp` from being swapped
        fds = [open_dir(source / sub), open_dir(target / sub)]
        try:
            proc = await asyncio.create_subprocess_exec(
                "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--no-new-privs", "--bounding-set=-all",
                "cp", "-a", "--reflink=auto", "-T", *(f"/proc/self/fd/{fd}/" for fd in fds),
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=fds,
                env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
        finally:
            for fd in fds:
                os.close(fd)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise ForkFailed(f"copying the workspace failed: {err.decode(errors='replace')}")
    await asyncio.to_thread(install_runner, target)


async def remove_dir(directory: Path) -> None:
    await asyncio.to_thread(shutil.rmtree, directory, True)


async def clone(
    workspace: Path, uid: int, url: str, ref: str | None, *, allow_local: bool, staging: Path
) -> None:
    """Clone `url` at `ref` into `workspace/repo` AS THE SANDBOX'S UID, on the host network
    (the sandbox has none) but in a mount namespace of its own that shows git the workspace
    at a neutral path (the host path above the sandboxes may be closed to it). The uid is
    fresh here (nothing of it runs user code yet), and git writes nowhere that uid could not
    write itself. A local source (tests only) is bundled by root first, into `staging`, so
    the uid never needs to read a host path. git's stderr is logged, never returned: it can
    quote what git read."""
    url = check_repo_url(url, allow_local=allow_local)
    checked_ref = check_ref(ref) or "HEAD"
    shown = f"cannot check out {url!r} at {checked_ref!r}"
    pin: dict[str, str] = {}
    if remote_of(url) is not None:
        url, pin = pinned(url, await public_address(url))
    used_staging = False
    try:
        bundle = ""
        if "://" not in url or url.startswith("file:"):
            used_staging = True
            bundle = await _bundle(url, staging, shown)
        command = ["unshare", "--mount", "--", "/bin/sh", "-c", CLONE_SH, "clone",
                   str(workspace), bundle, str(uid), url, checked_ref]  # fmt: skip
        protocols = "https:ssh:git" + (":file" if allow_local else "")
        detail = await _git(command, {**GIT_ENV, "GIT_ALLOW_PROTOCOL": protocols, **pin}, shown)
    finally:
        if used_staging:
            await remove_dir(staging)
    if detail is not None:
        log.warning("git clone failed", extra={"workspace": str(workspace), "stderr": detail})
        raise BadSpec(f"{shown}: the repository or ref was not found or is unreachable")


async def public_address(url: str) -> str:
    """The address a remote repository URL's host resolves to, once every address it answers
    is judged public (or allowed by `FLEET_EGRESS_ALLOW`); BadSpec naming why not."""
    try:
        return str(await egress.arepository(url))
    except AddressRefused as exc:
        raise BadSpec(str(exc)) from None


async def _bundle(source: str, staging: Path, shown: str) -> str:
    path = source.removeprefix("file://")
    await asyncio.to_thread(staging.mkdir, 0o700, True)
    target = staging / "source.bundle"
    command = ["git", "-C", path, "bundle", "create", "--quiet", str(target), "--all"]
    detail = await _git(command, GIT_ENV, shown)
    if detail is not None:
        log.warning("git bundle failed", extra={"stderr": detail})
        raise BadSpec(f"{shown}: the repository or ref was not found or is unreachable")
    os.chmod(target, 0o444)
    return str(target)


async def _git(argv: list[str], env: dict[str, str], shown: str) -> str | None:
    """Run a git step; None if it worked, else its stderr (for the log only)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        _, err = await asyncio.wait_for(proc.communicate(), CLONE_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise BadSpec(f"{shown}: it took over {CLONE_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        return err.decode(errors="replace").strip()[-4000:]
    return None


def count_entries(tops: list[Path], cap: int) -> int:
    """Entries under `tops`, never following a link, stopping once past `cap`. The tree is
    the sandbox's: entries vanishing or swapped mid-walk are skipped, never followed."""
    found = 0
    stack = [str(top) for top in tops]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    found += 1
                    if found > cap:
                        return found
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
        except OSError:
            continue
    return found


def open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def install_runner(directory: Path) -> None:
    """runner.py and confine.py in a root-owned directory only root writes to (0711)."""
    for source in RUNNER_FILES:
        shutil.copyfile(source, directory / source.name)
        os.chmod(directory / source.name, 0o444)
