"""File access inside a workspace never leaves it, whatever links the sandbox planted."""

import os
from pathlib import Path

import pytest

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
