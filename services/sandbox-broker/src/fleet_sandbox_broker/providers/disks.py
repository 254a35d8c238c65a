"""Disk quotas the kernel enforces, one per fork family: a loop-mounted ext4 image.

The host's filesystems have no project quotas here, so each family gets a filesystem of its
own: `<root>/.families/<family>.img`, a sparse file of the family's byte quota made with
`mke2fs -N <inodes>`, mounted (loop, `nosuid,nodev,noatime`) at `<root>/.families/<family>/`.
A member's directory lives in it, `<root>/.families/<family>/<id>/`, and `<root>/<id>` is a
root-owned link to it, so every host path of a sandbox (`<root>/<id>/workspace`, its runner,
the recorded workspace) reads as before. A write past the quota gets `ENOSPC` from the kernel,
whether a cell runs or not, and the sandbox keeps answering; no copy is made on fork (a fork's
files are copied inside its family's filesystem, against the same quota).

The image is mounted before the family's first process starts its mount namespace (which
binds the sandboxes' root recursively), so a fork, made inside that namespace, sees its own
directory there too. The layout on disk is the record: a member's link names its family, a
starting provider mounts every image not mounted yet (a host restart, another broker's clean
stop), a revive or takeover mounts its family's if it is not (`reach`; so do a file read or
write, a clone, a fork's placing and the disk watch: another provider on the root may have
unmounted it as it stopped), a provider that stops
unmounts those it mounted (its sandboxes' processes keep their own mount namespaces' copies,
and the images keep the files), and a family's image is unmounted and deleted with its last
member's directory.

Where a loop device cannot be made (no root, no `mke2fs`, a container without loop devices)
there is no quota: `FamilyDisks.why` says why, the broker logs it at start, and the workspace
is bounded by the inode count and `RLIMIT_FSIZE` per file only (docs/sandboxes.md).
"""

import contextlib
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("fleet.sandbox.disks")

FAMILIES = ".families"
MIB = 1024 * 1024
FULL_BYTES = 256 * 1024
MKFS = ("mke2fs", "-q", "-F", "-t", "ext4", "-m", "0", "-O", "^has_journal", "-E",
        "lazy_itable_init=1,nodiscard")  # fmt: skip
"""No journal and no reserved blocks: a sandbox's files are scratch space (a host crash
loses the REPL anyway), and every block of the quota is the family's."""
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
COMMAND_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


@dataclass(frozen=True)
class DiskUse:
    """A family filesystem's use, as `statvfs` reports it (what the family's code may use)."""

    bytes_used: int
    bytes_quota: int
    inodes_used: int
    inodes_quota: int

    @property
    def full(self) -> str | None:
        """What ran out ("bytes" or "inodes") when the family can write (next to) nothing more:
        no inode left, or less than 1 % of the quota (at least 256 KiB). A single large write
        can fail with more left than that (ext4 reserves room for the metadata a write may
        need), and then the disk is not full: smaller writes still succeed."""
        if self.inodes_used >= self.inodes_quota:
            return "inodes"
        if self.bytes_quota - self.bytes_used < max(FULL_BYTES, self.bytes_quota // 100):
            return "bytes"
        return None


def use_of(path: Path) -> DiskUse:
    st = os.statvfs(path)
    return DiskUse(
        bytes_used=(st.f_blocks - st.f_bavail) * st.f_frsize,
        bytes_quota=st.f_blocks * st.f_frsize,
        inodes_used=st.f_files - st.f_favail,
        inodes_quota=st.f_files,
    )


class FamilyDisks:
    """The families' filesystems under `<root>/.families` (module docstring)."""

    def __init__(self, root: Path, disk_mb: int, inodes: int) -> None:
        self.root = root
        self.base = root / FAMILIES
        self.disk_mb = disk_mb
        self.inodes = inodes
        self.why = ""
        """Why there is no quota ("" while there is one)."""
        self._mine: set[str] = set()
        """The families this provider mounted (unmounted again by `unmount_mine`)."""
        if disk_mb <= 0:
            self.why = "turned off (FLEET_SANDBOX_FAMILY_DISK_MB is 0)"
            return
        self.base.mkdir(mode=0o711, exist_ok=True)
        os.chmod(self.base, 0o711)  # noqa: S103 - traversable, not listable
        self.why = self._probe()
        if not self.why:
            self._mount_all()

    @property
    def on(self) -> bool:
        return not self.why

    def _probe(self) -> str:
        """Make, mount and drop one tiny family: what fails is why there is no quota."""
        if shutil.which("mke2fs", path=COMMAND_ENV["PATH"]) is None:
            return "mke2fs is not installed (the e2fsprogs package)"
        probe = f".probe-{os.getpid()}-{id(self):x}"
        try:
            self._make(probe, size_mb=2, inodes=64)
        except OSError as exc:
            return f"cannot loop-mount a filesystem image under {self.base}: {exc}"
        self._drop(probe)
        return ""

    def _mount_all(self) -> None:
        """Mount each family image left unmounted (the host restarted, and with it the mounts):
        its members' links must lead to their files again before anything reads them."""
        for image in sorted(self.base.glob("*.img")):
            if not image.name.startswith("."):  # another provider's probe, gone in a moment
                self._mount(image.with_suffix("").name)

    def _mount(self, family: str) -> bool:
        image, point = self.base / f"{family}.img", self.base / family
        if os.path.ismount(point):
            return True
        if not (image.is_file() and point.is_dir()):
            return False
        try:
            _mount_image(image, point)
        except OSError as exc:  # another broker on this root mounted it meanwhile
            if not os.path.ismount(point):
                log.error("cannot mount a family's image", extra={"image": str(image),
                                                                   "error": str(exc)})  # fmt: skip
                return False
            return True
        self._mine.add(family)
        return True

    def reach(self, directory: Path) -> None:
        """Mount the filesystem of the family holding `directory` if it is not mounted (a
        revive or takeover after the provider that mounted it stopped)."""
        family = self.family_of(directory)
        if family is not None:
            self._mount(family)

    def unmount_mine(self) -> None:
        """Unmount the families this provider mounted (at its stop): their files stay in their
        images, and whoever next needs one mounts it again."""
        for family in sorted(self._mine):
            point = self.base / family
            if os.path.ismount(point):
                with contextlib.suppress(OSError):
                    _run("umount", "-l", str(point))
        self._mine.clear()

    # -- a family and its members ---------------------------------------------------------------

    @property
    def family_inodes(self) -> int:
        """Inodes a family's filesystem has: `inodes`, or one per 4 KiB block of the quota if
        that is fewer (an inode table must fit in the filesystem it describes)."""
        return max(64, min(self.inodes, self.disk_mb * MIB // 4096))

    def create_family(self, family: str) -> None:
        """A new family's filesystem, mounted."""
        self._make(family, size_mb=self.disk_mb, inodes=self.family_inodes)

    def place(self, family: str, member: str) -> Path:
        """`<root>/<member>` as a link to the member's directory in its family's filesystem
        (made, 0711 root's); returns the link."""
        if not self._mount(family):
            raise OSError(f"the fork family {family}'s image does not mount")
        real = self.base / family / member
        real.mkdir(mode=0o711)
        os.chmod(real, 0o711)  # noqa: S103 - traversable only, as every sandbox directory
        link = self.root / member
        os.symlink(f"{FAMILIES}/{family}/{member}", link)
        return link

    def family_of(self, directory: Path) -> str | None:
        """The family whose filesystem holds the sandbox directory `directory` (None: it is a
        plain directory, made without a quota)."""
        try:
            target = os.readlink(directory)
        except OSError:
            return None
        parts = Path(target).parts
        if len(parts) == 3 and parts[0] == FAMILIES:
            return parts[1]
        return None

    def use(self, family: str) -> DiskUse:
        self._mount(family)  # another provider on this root may have unmounted it at its stop
        return use_of(self.base / family)

    def remove(self, directory: Path) -> None:
        """A member's directory and link; the family's filesystem goes with its last member."""
        family = self.family_of(directory)
        if family is None:
            shutil.rmtree(directory, ignore_errors=True)
            return
        point = self.base / family
        if not self._mount(family):  # unmounted, its other members' files are not seen
            log.error("cannot remove a sandbox's files: its family's image does not mount",
                      extra={"directory": str(directory), "family": family})  # fmt: skip
            return
        shutil.rmtree(point / directory.name, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            directory.unlink()
        try:
            left = [e for e in os.listdir(point) if e != "lost+found"]
        except OSError:
            left = []
        if not left:
            self._drop(family)

    # -- images ---------------------------------------------------------------------------------

    def _make(self, family: str, *, size_mb: int, inodes: int) -> None:
        image = self.base / f"{family}.img"
        point = self.base / family
        with open(image, "xb") as out:
            out.truncate(size_mb * MIB)  # sparse: only what the family writes takes disk
        try:
            _run(*MKFS, "-N", str(inodes), str(image))
            point.mkdir(mode=0o711)
            _mount_image(image, point)
            self._mine.add(family)
            os.chmod(point, 0o711)  # noqa: S103 - the filesystem's root: traversable only
        except BaseException:
            if os.path.ismount(point):
                with contextlib.suppress(OSError):
                    _run("umount", "-l", str(point))
            self._mine.discard(family)
            with contextlib.suppress(OSError):
                point.rmdir()
            image.unlink(missing_ok=True)
            raise

    def _drop(self, family: str) -> None:
        image = self.base / f"{family}.img"
        point = self.base / family
        if os.path.ismount(point):
            try:
                _run("umount", str(point))
            except OSError:  # busy (a process still inside): detached, freed once it is not
                _run("umount", "-l", str(point))
        with contextlib.suppress(OSError):
            point.rmdir()
        image.unlink(missing_ok=True)
        self._mine.discard(family)


MOUNT_TRIES = 5


def _mount_image(image: Path, point: Path) -> None:
    """`mount -o loop`, tried again on failure: two mounts at once can race for the same free
    loop device, and the loser fails ("failed to setup loop device"). An image still attached
    (its sandboxes' namespaces hold their copies of a mount the host dropped) is mounted again
    through the same loop device (util-linux looks for one on the same file), so the host and
    the sandboxes always share one filesystem, never two on one image."""
    for attempt in range(MOUNT_TRIES):
        try:
            _run("mount", "-o", MOUNT_OPTIONS, str(image), str(point))
            return
        except OSError:
            if os.path.ismount(point) or attempt == MOUNT_TRIES - 1:
                raise
            time.sleep(0.02 * (attempt + 1))


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, env=COMMAND_ENV, timeout=60, check=False)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).decode(errors="replace").strip()
        raise OSError(f"{argv[0]} failed ({done.returncode}): {detail[:400]}")
