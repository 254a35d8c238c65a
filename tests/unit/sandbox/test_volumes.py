"""Volume directories are created and handed over part by part, never through a link."""

import os
from pathlib import Path

import pytest

from fleet_sandbox_broker.errors import PathRefused
from fleet_sandbox_broker.volumes import Volumes, check_subpath, child_subpath

UID = 320999


def test_a_childs_volume_lives_outside_every_volume_tree(tmp_path: Path) -> None:
    volumes = Volumes(tmp_path)
    sub = child_subpath("kid1")
    assert volumes.directory("t1", "v1", sub) == tmp_path / "t1/.children/v1/kid1"
    assert volumes.ensure("t1", "v1", sub, UID).stat().st_uid == UID
    with pytest.raises(PathRefused):
        check_subpath(sub)  # no request may name one


def test_a_link_in_the_subpath_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "secret").write_text("x")
    volumes = Volumes(tmp_path / "volumes")
    volumes.ensure("t1", "v1", None, UID)
    os.symlink(decoy, tmp_path / "volumes/t1/v1/a")
    with pytest.raises(PathRefused):
        volumes.ensure("t1", "v1", "a/b", UID)
    with pytest.raises(PathRefused):
        volumes.prepare("t1", "v1", "a")
    assert not (decoy / "b").exists()
    assert (decoy / "secret").stat().st_uid == os.getuid()


def test_handing_over_never_follows_a_link_inside(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    volumes = Volumes(tmp_path / "volumes")
    path = volumes.ensure("t1", "v1", "s1", UID)
    (path / "d").mkdir()
    (path / "d/f").write_text("y")
    os.symlink(outside, path / "d/link")
    volumes.ensure("t1", "v1", "s1", UID)
    assert (path / "d/f").stat().st_uid == UID
    assert (path / "d/link").lstat().st_uid == UID
    assert outside.stat().st_uid == os.getuid()
