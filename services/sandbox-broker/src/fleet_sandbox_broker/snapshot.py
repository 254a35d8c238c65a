"""A bounded text snapshot of a parent's uploaded local checkout, for a clean child.

When the parent's context came from an uploaded checkout (no repo URL to clone again), the
child gets `artifacts/rlm-inputs/local_workspace_snapshot.txt`: the text files under the
parent's context paths, each cut at `file_bytes`, the whole cut at `max_bytes`. Links are
never followed and binary files are skipped: the parent's workspace is sandbox-written.
"""

import os
import stat
from pathlib import Path

SNAPSHOT_PATH = "artifacts/rlm-inputs/local_workspace_snapshot.txt"


def _files(workspace: Path, context_paths: list[str]) -> list[str]:
    root = os.path.realpath(workspace)
    found: list[str] = []
    for entry in context_paths or ["."]:
        start = os.path.realpath(os.path.join(root, entry))
        if start != root and not start.startswith(root + os.sep):
            continue
        if os.path.isfile(start) and not os.path.islink(start):
            found.append(os.path.relpath(start, root))
            continue
        for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return found


def build(workspace: Path, context_paths: list[str], *, max_bytes: int, file_bytes: int) -> str:
    header = (
        f"# Local workspace snapshot of the parent's context paths {context_paths or ['.']}\n"
        f"# bounded: at most {max_bytes} bytes, each file cut at {file_bytes} bytes\n"
    )
    parts = [header]
    used = len(header)
    skipped = 0
    for rel in _files(workspace, context_paths):
        try:
            fd = os.open(workspace / rel, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as src:
            info = os.fstat(src.fileno())
            if not stat.S_ISREG(info.st_mode):
                continue
            data = src.read(file_bytes)
        if b"\0" in data[:1024]:
            continue
        text = data.decode("utf-8", errors="replace")
        cut = " (cut)" if info.st_size > file_bytes else ""
        block = f"\n=== {rel} ({info.st_size} bytes{cut}) ===\n{text}\n"
        if used + len(block.encode()) > max_bytes - 128:  # room for the closing note
            skipped += 1
            continue
        parts.append(block)
        used += len(block.encode())
    if skipped:
        parts.append(f"\n[snapshot bound reached: {skipped} more files not included]\n")
    return "".join(parts)
