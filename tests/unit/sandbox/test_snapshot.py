"""The clean child's snapshot reads only the parent's own regular files, however it races."""

import os
import stat
import threading
from pathlib import Path

from fleet_harness.waits import eventually_sync
from fleet_sandbox_broker import snapshot

SECRET = "root-only-secret-value-7c1e"


def build(workspace: Path, paths: list[str]) -> str:
    return snapshot.build(workspace, paths, max_bytes=256 * 1024, file_bytes=32 * 1024)


def secret_dir(tmp_path: Path) -> Path:
    secret = tmp_path / "secret-dir"
    secret.mkdir(mode=0o700)
    (secret / "f.txt").write_text(SECRET)
    (secret / "f.txt").chmod(0o600)
    return secret


def test_links_fifos_and_hidden_directories_are_skipped(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "ctx" / "d").mkdir(parents=True)
    (ws / "ctx" / ".git").mkdir()
    (ws / "ctx" / "d" / "f.txt").write_text("plain text")
    (ws / "ctx" / ".git" / "config").write_text("hidden dir")
    (ws / "ctx" / "link").symlink_to(secret_dir(tmp_path))
    (ws / "ctx" / "file-link").symlink_to(tmp_path / "secret-dir" / "f.txt")
    os.mkfifo(ws / "ctx" / "pipe")
    text = build(ws, ["ctx"])
    assert "=== ctx/d/f.txt (10 bytes) ===\nplain text" in text
    assert SECRET not in text
    for name in ("link", "file-link", "pipe", "hidden dir"):
        assert name not in text
    # a context path that is itself a link, a FIFO or outside the workspace gives nothing
    for paths in (["ctx/link"], ["ctx/link/f.txt"], ["ctx/pipe"], ["../secret-dir"], ["/etc"]):
        assert "===" not in build(ws, paths), paths
    assert "=== ctx/d/f.txt" in build(ws, ["ctx/d/f.txt"])
    assert "=== ctx/d/f.txt" in build(ws, ["./ctx/x/../d"])


def test_a_directory_swapped_for_a_link_mid_walk_never_leaks_the_target(tmp_path: Path) -> None:
    """The parent's sandbox keeps swapping ctx/d for a link to a root-only dir while we read."""
    ws = tmp_path / "ws"
    (ws / "ctx" / "d").mkdir(parents=True)
    for i in range(20):
        (ws / "ctx" / f"a{i}.txt").write_text("padding " * 50)  # widen the race window
    (ws / "ctx" / "d" / "f.txt").write_text("the parent's own file")
    target = secret_dir(tmp_path)
    assert stat.S_IMODE(os.stat(target / "f.txt").st_mode) == 0o600
    stop = threading.Event()
    swaps = [0]

    def swapper() -> None:
        d, kept, link = ws / "ctx" / "d", ws / "ctx" / "d.real", ws / "ctx" / "d.link"
        while not stop.is_set():
            os.rename(d, kept)
            os.symlink(target, link)
            os.rename(link, d)  # d is now the link
            os.unlink(d)
            os.rename(kept, d)  # d is the directory again
            swaps[0] += 1

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        eventually_sync(lambda: swaps[0] > 0, timeout=5, what="the swapper to start")
        seen_own = 0
        for _ in range(300):
            text = build(ws, ["ctx"])
            assert SECRET not in text
            seen_own += "the parent's own file" in text
        for _ in range(300):
            text = build(ws, ["ctx/d"])
            assert SECRET not in text
            text = build(ws, ["ctx/d/f.txt"])
            assert SECRET not in text
    finally:
        stop.set()
        thread.join(timeout=5)
    assert swaps[0] > 10
