"""Durable volumes of the local provider: host directories named by rule, never by caller path.

`<volumes root>/<tenant>/<volume>/<subpath>`: tenant and volume are ids, the subpath is a
`/`-joined list of ids (a child's is its parent's plus `children/<child>`), so no request can
name a directory outside its tenant's volumes. Browsing (list, read) is capped and never
follows links.
"""

import os
import stat
from pathlib import Path
from typing import Literal

from fleet_events.ids import InvalidId, check_id
from fleet_events.sandbox import VolumeEntry, VolumeListing
from fleet_sandbox_broker.errors import PathRefused
from fleet_sandbox_broker.providers.files import open_dir, read_in


def check_subpath(subpath: str | None) -> list[str]:
    if not subpath:
        return []
    try:
        return [check_id("volume subpath part", part) for part in subpath.split("/")]
    except InvalidId as exc:
        raise PathRefused(f"volume subpath {subpath!r} is refused: {exc}") from exc


def child_subpath(parent: str | None, child: str) -> str:
    return "/".join([*check_subpath(parent), "children", check_id("sandbox", child)])


class Volumes:
    def __init__(self, root: Path) -> None:
        self.root = root

    def directory(self, tenant: str, volume: str, subpath: str | None = None) -> Path:
        parts = [check_id("tenant", tenant), check_id("volume", volume), *check_subpath(subpath)]
        return self.root.joinpath(*parts)

    def ensure(self, tenant: str, volume: str, subpath: str | None, uid: int) -> Path:
        """Create the directory (0700) and hand the whole tree to the sandbox's uid."""
        path = self.directory(tenant, volume, subpath)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o711)  # noqa: S103 - traversal only
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            os.chown(dirpath, uid, uid, follow_symlinks=False)
            for name in (*dirnames, *filenames):
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
        return path

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

    def read(self, tenant: str, volume: str, path: str, max_bytes: int) -> bytes:
        return read_in(self.directory(tenant, volume), path, max_bytes)
