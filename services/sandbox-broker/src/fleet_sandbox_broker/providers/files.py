"""Files inside a sandbox's workspace (or a volume), as root, never following a link out.

The workspace is written by sandbox code, so a path is walked one component at a time with
`O_NOFOLLOW` directory fds: `..`, absolute paths and links planted by the sandbox are refused,
and reads are capped before they are made.
"""

import errno
import os
import stat
from pathlib import Path

from fleet_sandbox_broker.errors import PathRefused, TooLarge


def components(path: str) -> list[str]:
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or path.startswith("/") or ".." in parts:
        raise PathRefused(
            f"path {path!r} is refused: give a relative path inside the workspace, without '..'"
        )
    return parts


def open_dir(workspace: Path, parts: list[str], create_as: int | None) -> int:
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if create_as is None:
                    raise
                os.mkdir(part, 0o700, dir_fd=fd)
                os.chown(part, create_as, create_as, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PathRefused(f"{part!r} is a link or not a directory") from exc
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(name: str, dir_fd: int, flags: int, shown: str, mode: int = 0o600) -> int:
    """Open `name` under `dir_fd` only if it is a regular file; the fd returned blocks.

    The open itself never blocks (`O_NONBLOCK`: a FIFO planted by the sandbox would hang a
    worker thread before any check), never follows a link (`O_NOFOLLOW`) and never takes a
    terminal (`O_NOCTTY`); anything but a regular file is refused before a byte moves.
    """
    extra = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY
    try:
        fd = os.open(name, flags | extra, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(f"{shown!r} is a link; links are not followed") from exc
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EISDIR, errno.ETXTBSY):
            # ENXIO: a FIFO with no reader opened to write; the others: not a plain file
            raise PathRefused(f"{shown!r} is not a regular file") from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused(f"{shown!r} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_in(workspace: Path, path: str, data: bytes, uid: int) -> None:
    parts = components(path)
    dir_fd = open_dir(workspace, parts[:-1], uid)
    try:
        # no O_TRUNC at open: only a file already known to be regular is truncated
        fd = open_regular(parts[-1], dir_fd, os.O_WRONLY | os.O_CREAT, path)
        with os.fdopen(fd, "wb") as out:
            os.fchown(out.fileno(), uid, uid)
            os.ftruncate(out.fileno(), 0)
            out.write(data)
    finally:
        os.close(dir_fd)


def read_in(workspace: Path, path: str, max_bytes: int, *, prefix: bool = False) -> bytes:
    """The file's bytes, refused when over `max_bytes`; with `prefix`, its first `max_bytes`
    (a preview of a file of any size)."""
    parts = components(path)
    try:
        dir_fd = open_dir(workspace, parts[:-1], None)
    except FileNotFoundError as exc:
        raise PathRefused(f"no file {path!r} in the workspace") from exc
    try:
        try:
            fd = open_regular(parts[-1], dir_fd, os.O_RDONLY, path)
        except FileNotFoundError as exc:
            raise PathRefused(f"no file {path!r} in the workspace") from exc
        with os.fdopen(fd, "rb") as src:
            info = os.fstat(src.fileno())
            if info.st_size > max_bytes and not prefix:
                raise TooLarge(
                    f"{path!r} is {info.st_size} bytes, over the {max_bytes}-byte read limit; "
                    "ask for it through the object store (via_blob) or raise max_bytes"
                )
            return src.read(max_bytes + 1)[:max_bytes]
    finally:
        os.close(dir_fd)
