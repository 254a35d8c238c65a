"""`fleet run --context`: what paths become before any request, and every refusal named."""

import io
import tarfile
from pathlib import Path

import pytest

from fleet_cli.context import MAX_PATHS, ContextError, alias_of, gather


def test_files_become_documents_with_unique_aliases_an_id_allows(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first, second = tmp_path / "notes.txt", tmp_path / "a" / "notes.md"
    first.write_text("one")
    second.write_text("two")
    odd = tmp_path / "Q3 report (final).txt"
    odd.write_text("three")
    given = gather([first, second, odd])
    assert given.document_ids == ["notes", "notes-2", "Q3-report-final"]
    assert [d.data for d in given.documents] == [b"one", b"two", b"three"]
    assert given.checkout is None
    assert given.context_paths == []
    assert alias_of(Path(".env"), set()) == "env"  # a dot file keeps its name


def test_a_directory_is_a_checkout_of_its_regular_files_without_vcs_and_caches(
    tmp_path: Path,
) -> None:
    root = tmp_path / "repo"
    for name in ("src/app.py", ".git/HEAD", "node_modules/x/i.js", "src/__pycache__/a.pyc"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / "link").symlink_to(root / "src" / "app.py")
    given = gather([root])
    assert given.checkout is not None
    assert given.checkout.files == ("src/app.py",)
    assert given.context_paths == ["src/app.py"]
    with tarfile.open(fileobj=io.BytesIO(given.checkout.bundle), mode="r:gz") as archive:
        assert [m.name for m in archive.getmembers()] == ["src/app.py"]


def test_a_checkout_past_what_a_message_names_is_named_as_a_whole(tmp_path: Path) -> None:
    for n in range(MAX_PATHS + 1):
        (tmp_path / f"f{n}.txt").write_text("x")
    assert gather([tmp_path]).context_paths == ["."]


def test_bad_paths_are_refused_naming_the_path(tmp_path: Path) -> None:
    binary, empty = tmp_path / "b.bin", tmp_path / "empty"
    binary.write_bytes(b"ok\xff")
    empty.mkdir()
    for path, said in (
        (tmp_path / "missing.txt", "no such file or directory"),
        (binary, "not UTF-8 text (byte 2)"),
        (empty, "holds no regular file"),
    ):
        with pytest.raises(ContextError) as refused:
            gather([path])
        assert str(refused.value).startswith(f"--context {path}: ")
        assert said in str(refused.value)


def test_a_second_directory_is_refused_with_what_to_do(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f.txt").write_text(name)
    with pytest.raises(ContextError, match="holds one checkout: pass their common parent"):
        gather([tmp_path / "a", tmp_path / "b"])
