"""How a local sandbox process is started: its namespaces, its filesystem view, its
environment, its first frame.

    unshare --net --mount --pid --fork -- /bin/sh setup.sh <root> <show> <hide> [binds] -- \
        setpriv --reuid=U --regid=U --clear-groups --no-new-privs --bounding-set=-all \
        --inh-caps=-all /usr/bin/python3 -I <root>/<id>/runner.py

- its own network namespace: no interface but a down loopback, so NATS, the LLM server and
  the outside are unreachable;
- its own mount namespace (setup.sh) whose root is built by allow-list (SHOW, ETC), with the
  workspace and volumes nosuid,nodev;
- its own pid namespace, shared by its fork family: the runner forks itself at start and
  stays behind as the namespace's init (runner.py, `be_init`), and `/proc` is the
  namespace's own, so a sandbox sees its family's processes and nothing else;
- a seccomp filter the runner installs before anything else runs (confine.py);
- a uid of its own (one per fork family, from a pool), no groups, no capabilities, no way to
  regain privileges;
- an environment built from nothing (PATH, HOME, TMPDIR, LANG, MALLOC_ARENA_MAX);
- rlimits set by the runner from the first frame, before any user code.
"""

import hashlib
import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

from fleet_events.sandbox import Limits
from fleet_sandbox_broker.providers import frames

# The sandbox's root filesystem, built by allow-list in its own mount namespace: a tmpfs over
# /tmp (private to the namespace) becomes `/`, holding only SHOW (directories bound, links
# copied), `/etc` (the provider's copy of the ETC entries, bound), /proc, a minimal /dev (its
# nodes copied onto a tmpfs of its own), an empty /tmp and the sandbox root at its own path
# (so roots under /tmp, as in tests, still resolve), mounted nosuid and nodev; then
# pivot_root into it and return to the workspace (the cwd it was started in). Every external
# command is a process start, and they are most of a cold create: each step does in one
# what it can. Args: $1 root, $2 SHOW, $3 HIDE (paths without spaces), volume binds (source
# target) up to "--", then the command.
SETUP_SH = """set -e
R="$1"; SHOW="$2"; HIDE="$3"; shift 3
W="$PWD"
while [ "$1" != "--" ]; do
  mount --no-canonicalize --bind "$1" "$2"
  mount --no-canonicalize -o remount,bind,nosuid,nodev "$2"
  shift 2
done
shift
exec 8<"$R"
N=/tmp
mount -t tmpfs -o size=64k,mode=755,nosuid,nodev tmpfs "$N"
LINKS=""; DIRS=""; MADE=""
for d in $SHOW; do
  if [ -L "$d" ]; then LINKS="$LINKS $d"
  elif [ -d "$d" ]; then DIRS="$DIRS $d"; MADE="$MADE $N$d"
  fi
done
DEV=""
for f in null zero full random urandom fd stdin stdout stderr; do
  if [ -e "/dev/$f" ] || [ -L "/dev/$f" ]; then DEV="$DEV /dev/$f"; fi
done
mkdir -p "$N/etc" "$N/proc" "$N/dev" "$N/tmp" "$N$R" $MADE
if [ -n "$LINKS" ]; then cp -P --parents $LINKS "$N"; fi
for d in $DIRS; do mount --rbind "$d" "$N$d"; done
mount --rbind /proc/self/fd/8/.broker/etc "$N/etc"
mount -t proc -o nosuid,nodev,noexec proc "$N/proc"
mount -t tmpfs -o size=16k,mode=755,nosuid,noexec tmpfs "$N/dev"
cp -a $DEV "$N/dev/"
mount -o remount,ro,bind "$N/dev"
mount --no-canonicalize --rbind /proc/self/fd/8 "$N$R"
exec 8<&-
mount --no-canonicalize -o remount,bind,nosuid,nodev "$N$R"
for h in $HIDE; do
  case "$R/" in "$h"/*) continue ;; esac
  if [ -d "$N$h" ] && [ ! -L "$N$h" ]; then mount -t tmpfs -o ro,size=4k tmpfs "$N$h"; fi
done
cd "$N"
PATH="/usr/sbin:/sbin:$PATH" pivot_root . .
umount -l .
mount -o remount,ro,bind /
cd "$W"
unset OLDPWD
exec "$@"
"""

# What a sandbox sees of the host: Python and the tools it runs need these, nothing else.
SHOW = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = (
    "passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "localtime", "timezone", "mime.types", "protocols", "services", "hosts", "host.conf",
    "os-release", "alternatives", "python3", "python3.11", "python3.12", "python3.13",
)  # fmt: skip

HIDE: tuple[str, ...] = ()  # the allow-list shows none of /home, /root, /work, /run, /var ...
MIB = 1024 * 1024


def prepare_etc(private: Path) -> None:
    """`<private>/etc`, the `/etc` every sandbox of this provider sees: a copy of the ETC
    entries (links kept as links), root's, bound into each sandbox. Brokers sharing a root
    start at once, and a sandbox may be binding it meanwhile, so a copy is never changed in
    place: it is named by its content (`etc-<digest>`), built aside and renamed into place,
    and `etc` is a link swapped atomically to it."""
    digest = hashlib.sha256()
    for name in ETC:
        _digest_entry(Path("/etc") / name, name, digest)
    name = f"etc-{digest.hexdigest()[:16]}"
    final = private / name
    if not final.is_dir():
        staging = private / f".staging-{uuid.uuid4().hex}"
        staging.mkdir(mode=0o755)
        for entry in ETC:
            _copy_entry(Path("/etc") / entry, staging / entry)
        try:
            os.rename(staging, final)
        except OSError:  # another broker on this root made the same copy first
            shutil.rmtree(staging, ignore_errors=True)
    link = private / "etc"
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)  # a copy made in place by an earlier version
    scratch = private / f".etc-{uuid.uuid4().hex}"
    os.symlink(name, scratch)
    os.replace(scratch, link)


def _digest_entry(path: Path, shown: str, digest: "hashlib._Hash") -> None:
    if path.is_symlink():
        digest.update(f"L {shown} {os.readlink(path)}\n".encode())
    elif path.is_dir():
        digest.update(f"D {shown}\n".encode())
        for child in sorted(os.listdir(path)):
            _digest_entry(path / child, f"{shown}/{child}", digest)
    elif path.is_file():
        digest.update(f"F {shown} ".encode() + hashlib.sha256(path.read_bytes()).digest())


def _copy_entry(source: Path, target: Path) -> None:
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    elif source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    elif source.is_file():
        shutil.copy2(source, target)


def sandbox_env(directory: Path) -> dict[str, str]:
    """The whole environment of a sandbox: nothing of the broker's."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(directory / "workspace"),
        "TMPDIR": str(directory / "tmp"),
        "LANG": "C.UTF-8",
        "MALLOC_ARENA_MAX": "2",
    }


def argv(
    setup: Path,
    root: Path,
    show: tuple[str, ...],
    hide: tuple[str, ...],
    binds: dict[str, Path],
    directory: Path,
    uid: int,
    python: str,
) -> list[str]:
    """`binds`: host directories (volumes) at workspace-relative paths."""
    pairs: list[str] = []
    for target, source in binds.items():
        pairs += [str(source), str(directory / "workspace" / target)]
    return [
        "unshare", "--net", "--mount", "--pid", "--fork", "--", "/bin/sh", str(setup),
        str(root), " ".join(show), " ".join(hide), *pairs, "--",
        "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
        "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all",
        python, "-I", str(directory / "runner.py"),
    ]  # fmt: skip


def spawn(
    command: list[str], channel: socket.socket, directory: Path, log: Path
) -> "subprocess.Popen[bytes]":
    """The channel is the process's fd 0; its stderr (the runner's own failures) goes to a
    log only the broker reads; it starts in the workspace, in a session of its own."""
    with open(log, "ab") as err:
        return subprocess.Popen(
            command,
            stdin=channel.fileno(),
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=directory / "workspace",
            env=sandbox_env(directory),
            start_new_session=True,
            close_fds=True,
        )


def init_frame(
    limits: Limits, *, fork_ready: bool, output_cap: int, max_frame: int, nproc: int | None = None
) -> frames.Init:
    """`nproc`: the process limit when it is not `limits.nproc` (a fork-ready sandbox's is
    sized for its whole fork family, `local.family_nproc`)."""
    return frames.Init(
        limits={
            "RLIMIT_AS": limits.memory_mb * MIB,
            "RLIMIT_CPU": limits.cpu_s_total,
            "RLIMIT_NPROC": limits.nproc if nproc is None else nproc,
            "RLIMIT_FSIZE": limits.file_mb * MIB,
            "RLIMIT_NOFILE": limits.open_files,
            "RLIMIT_CORE": 0,
        },
        cell_cpu_s=limits.cpu_s_per_cell,
        checkpoints=fork_ready,
        output_cap=output_cap,
        max_frame=max_frame,
        max_in=256 * MIB,
    )
