"""A bounded text snapshot of a parent's uploaded local checkout, for a clean child.

When the parent's context came from an uploaded checkout (no repo URL to clone again), the
child gets `artifacts/rlm-inputs/local_workspace_snapshot.txt`: the text files under the
parent's context paths, each cut at `file_bytes`, the whole cut at `max_bytes`. Binary files
are skipped.

The parent's workspace is written by sandbox code that may still be running, and the broker
reads it as root, so it is walked with directory fds only: every component is opened relative
to its parent's fd with `O_NOFOLLOW` (a directory swapped for a link mid-walk is refused by
the kernel, not by an earlier check), links are skipped, and a file is read only after `fstat`
says it is regular (opened non-blocking, so a FIFO cannot hang the broker). The walk itself is
bounded in depth and in entries looked at.
"""

import os
import posixpath
import stat
from collections.abc import Iterator
from pathlib import Path

from fleet_sandbox_broker.errors import PathRefused
from fleet_sandbox_broker.providers.files import open_regular

SNAPSHOT_PATH = "artifacts/rlm-inputs/local_workspace_snapshot.txt"

MAX_DEPTH = 32
MAX_ENTRIES = 20_000

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK


def _open_dir_at(name: str, dir_fd: int | None) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:  # a link (ELOOP), not a directory (ENOTDIR), gone, unreadable: skipped
        return None


def _entry_parts(entry: str) -> list[str] | None:
    norm = posixpath.normpath(entry.replace("\\", "/"))
    if norm.startswith(("/", "../")) or norm == "..":
        return None
    return [p for p in norm.split("/") if p not in ("", ".")]


class _Walk:
    def __init__(self) -> None:
        self.seen = 0

    def files(self, dir_fd: int, rel: str, depth: int) -> Iterator[tuple[int, str]]:
        """(dir fd, path) of each entry under the directory, files first, dirs after, sorted.

        Only names are yielded: the caller opens each with `O_NOFOLLOW` under `dir_fd`.
        """
        if depth > MAX_DEPTH:
            return
        try:
            names = sorted(os.listdir(dir_fd))
        except OSError:
            return
        subdirs: list[str] = []
        for name in names:
            self.seen += 1
            if self.seen > MAX_ENTRIES:
                return
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if not name.startswith("."):
                    subdirs.append(name)
            elif stat.S_ISREG(info.st_mode):
                yield dir_fd, name if not rel else f"{rel}/{name}"
        for name in subdirs:
            sub = _open_dir_at(name, dir_fd)
            if sub is None:
                continue
            try:
                yield from self.files(sub, name if not rel else f"{rel}/{name}", depth + 1)
            finally:
                os.close(sub)


def _read(dir_fd: int, name: str, file_bytes: int) -> tuple[bytes, int] | None:
    try:
        fd = open_regular(name, dir_fd, os.O_RDONLY, name)
    except (OSError, PathRefused):
        return None
    with os.fdopen(fd, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        return src.read(file_bytes), size


def _contents(
    workspace: Path, context_paths: list[str], file_bytes: int
) -> Iterator[tuple[str, bytes, int]]:
    """(path, first `file_bytes` bytes, size) of each regular file under the context paths."""
    root = _open_dir_at(str(workspace), None)
    if root is None:
        return
    walk = _Walk()
    try:
        for entry in context_paths or ["."]:
            parts = _entry_parts(entry)
            if parts is None:
                continue
            if not parts:
                for dir_fd, rel in walk.files(root, "", 0):
                    got = _read(dir_fd, rel.rsplit("/", 1)[-1], file_bytes)
                    if got is not None:
                        yield rel, *got
                continue
            parent = os.dup(root)
            try:
                for part in parts[:-1]:
                    nxt = _open_dir_at(part, parent)
                    os.close(parent)
                    parent = -1
                    if nxt is None:
                        break
                    parent = nxt
                if parent < 0:
                    continue
                top = "/".join(parts)
                sub = _open_dir_at(parts[-1], parent)
                if sub is None:  # not a directory: a regular file, or skipped
                    got = _read(parent, parts[-1], file_bytes)
                    if got is not None:
                        yield top, *got
                    continue
                try:
                    for dir_fd, rel in walk.files(sub, top, 1):
                        got = _read(dir_fd, rel.rsplit("/", 1)[-1], file_bytes)
                        if got is not None:
                            yield rel, *got
                finally:
                    os.close(sub)
            finally:
                if parent >= 0:
                    os.close(parent)
    finally:
        os.close(root)


def build(workspace: Path, context_paths: list[str], *, max_bytes: int, file_bytes: int) -> str:
    header = (
        f"# Local workspace snapshot of the parent's context paths {context_paths or ['.']}\n"
        f"# bounded: at most {max_bytes} bytes, each file cut at {file_bytes} bytes\n"
    )
    parts = [header]
    used = len(header)
    skipped = 0
    for rel, data, size in _contents(workspace, context_paths, file_bytes):
        if b"\0" in data[:1024]:
            continue
        text = data.decode("utf-8", errors="replace")
        cut = " (cut)" if size > file_bytes else ""
        block = f"\n=== {rel} ({size} bytes{cut}) ===\n{text}\n"
        if used + len(block.encode()) > max_bytes - 128:  # room for the closing note
            skipped += 1
            continue
        parts.append(block)
        used += len(block.encode())
    if skipped:
        parts.append(f"\n[snapshot bound reached: {skipped} more files not included]\n")
    return "".join(parts)
