"""Durable volumes of the local provider: host directories named by rule, never by caller path.

`<volumes root>/<tenant>/<volume>/<subpath>`: tenant and volume are ids, the subpath is a
`/`-joined list of ids, so no request can name a directory outside its tenant's volumes.
A clean child's volume is `.children/<child>` (a subpath no request can give: `.` is not in an
id), kept at `<volumes root>/<tenant>/.children/<volume>/<child>`: outside every volume's tree,
so no sandbox (the parent, mounting its own volume or subpath, included) can reach it to plant
a link before it is mounted and handed to the child's uid. Directories are created and handed
over by fd, never following a link. Browsing (list, read) is capped and never follows links.
"""

import os
import stat
from pathlib import Path
from typing import Literal

from fleet_events.ids import InvalidId, check_id
from fleet_events.sandbox import VolumeEntry, VolumeListing
from fleet_sandbox_broker.errors import PathRefused
from fleet_sandbox_broker.providers.files import open_dir, read_in

CHILDREN = ".children"


def check_subpath(subpath: str | None) -> list[str]:
    """A subpath a request may give: ids only (never a child's `.children/<child>`)."""
    if not subpath:
        return []
    try:
        return [check_id("volume subpath part", part) for part in subpath.split("/")]
    except InvalidId as exc:
        raise PathRefused(f"volume subpath {subpath!r} is refused: {exc}") from exc


def child_subpath(child: str) -> str:
    return f"{CHILDREN}/{check_id('sandbox', child)}"


class Volumes:
    def __init__(self, root: Path) -> None:
        self.root = root

    def parts(self, tenant: str, volume: str, subpath: str | None = None) -> list[str]:
        tenant, volume = check_id("tenant", tenant), check_id("volume", volume)
        head, _, child = (subpath or "").partition("/")
        if head == CHILDREN:
            return [tenant, CHILDREN, volume, check_id("sandbox", child)]
        return [tenant, volume, *check_subpath(subpath)]

    def directory(self, tenant: str, volume: str, subpath: str | None = None) -> Path:
        return self.root.joinpath(*self.parts(tenant, volume, subpath))

    def _open(self, tenant: str, volume: str, subpath: str | None) -> int:
        """The directory, created (0700, root's) part by part, never through a link."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)  # noqa: S103 - traversal only
        return open_dir(self.root, self.parts(tenant, volume, subpath), 0)

    def prepare(self, tenant: str, volume: str, subpath: str | None) -> Path:
        os.close(self._open(tenant, volume, subpath))
        return self.directory(tenant, volume, subpath)

    def ensure(self, tenant: str, volume: str, subpath: str | None, uid: int) -> Path:
        """Create the directory (0700) and hand the whole tree to the sandbox's uid, by fd."""
        fd = self._open(tenant, volume, subpath)
        try:
            os.chown(fd, uid, uid)
            for _, dirs, files, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
                for name in (*dirs, *files):
                    os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.close(fd)
        return self.directory(tenant, volume, subpath)

    def listing(self, tenant: str, volume: str, path: str, max_entries: int) -> VolumeListing:
        base = self.directory(tenant, volume)
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts or path.startswith("/"):
            raise PathRefused(f"path {path!r} is refused: give a relative path inside the volume")
        try:
            fd = open_dir(base, parts, None)
        except FileNotFoundError as exc:
            raise PathRefused(f"no directory {path!r} in volume {volume!r}") from exc
        entries = []
        try:
            names = sorted(os.listdir(fd))
            for name in names[:max_entries]:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                kind: Literal["file", "dir", "other"] = "other"
                if stat.S_ISDIR(info.st_mode):
                    kind = "dir"
                elif stat.S_ISREG(info.st_mode):
                    kind = "file"
                entries.append(VolumeEntry(name=name, kind=kind, size=info.st_size))
        finally:
            os.close(fd)
        return VolumeListing(path=path, entries=entries, truncated=len(names) > max_entries)

    def read(
        self, tenant: str, volume: str, path: str, max_bytes: int, *, prefix: bool = False
    ) -> bytes:
        return read_in(self.directory(tenant, volume), path, max_bytes, prefix=prefix)
