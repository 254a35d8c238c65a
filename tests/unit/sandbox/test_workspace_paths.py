"""File access inside a workspace never leaves it, whatever links the sandbox planted."""

import os
import stat
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from fleet_harness.waits import eventually_sync
from fleet_sandbox_broker.errors import PathRefused, TooLarge
from fleet_sandbox_broker.providers.files import read_in, write_in

UID = os.getuid()


def test_write_then_read_creates_directories(tmp_path: Path) -> None:
    write_in(tmp_path, "a/b/c.txt", b"hello", UID)
    assert read_in(tmp_path, "a/b/c.txt", 100) == b"hello"


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "", "."])
def test_paths_leaving_the_workspace_are_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(PathRefused):
        read_in(tmp_path, path, 100)
    with pytest.raises(PathRefused):
        write_in(tmp_path, path, b"x", UID)


def test_links_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    (tmp_path / "file-link").symlink_to(outside / "secret")
    (tmp_path / "dir-link").symlink_to(outside)
    for path in ("file-link", "dir-link/secret"):
        with pytest.raises(PathRefused, match="link"):
            read_in(tmp_path, path, 100)
    with pytest.raises(PathRefused, match="link"):
        write_in(tmp_path, "dir-link/new", b"x", UID)
    assert (outside / "secret").read_text() == "s"
    assert not (outside / "new").exists()


def test_reads_over_the_cap_are_refused(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(TooLarge, match="101 bytes, over the 100-byte read limit"):
        read_in(tmp_path, "big", 100)


def promptly(call: Callable[[], object]) -> BaseException | None:
    """Run `call` in a thread and return what it raised (None if nothing), failing if it hangs.

    A blocking open of a FIFO would hang forever; the thread is a daemon so a regression fails
    the bounded wait instead of the whole run.
    """
    done: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:
            done.append(exc)
        else:
            done.append(None)

    threading.Thread(target=target, daemon=True).start()
    eventually_sync(lambda: bool(done), timeout=5, what="the call to return, not block")
    return done[0]


def test_a_fifo_is_refused_without_blocking_for_reads_and_writes(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "d" / "pipe")
    for path in ("pipe", "d/pipe"):
        caught = promptly(partial(read_in, tmp_path, path, 100))
        assert isinstance(caught, PathRefused), caught
        assert "not a regular file" in str(caught)
        caught = promptly(partial(write_in, tmp_path, path, b"x", UID))
        assert isinstance(caught, PathRefused), caught
        assert "not a regular file" in str(caught)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe").st_mode)


def test_a_fifo_with_a_reader_is_still_refused_for_writes(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    reader = os.open(tmp_path / "pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        caught = promptly(lambda: write_in(tmp_path, "pipe", b"x", UID))
        assert isinstance(caught, PathRefused), caught
        assert os.read(reader, 10) == b""
    finally:
        os.close(reader)


def test_writing_over_an_existing_file_replaces_its_contents(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"a much longer original")
    write_in(tmp_path, "f", b"short", UID)
    assert read_in(tmp_path, "f", 100) == b"short"
