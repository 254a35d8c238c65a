"""`fleet run --context PATH…`: what the paths become before anything is sent.

A file is a document of the session (`POST /api/v1/sessions/{id}/documents`): UTF-8 text (what
the gateway's upload takes), at most its 10 MiB, under an alias made from its
name (letters, digits, '_' and '-', unique in the turn). A directory is the session's checkout
(`POST /api/v1/sessions/{id}/checkout`): a gzipped tar of its regular files, paths relative to
it, leaving out what never belongs in a checkout's context (`.git`, virtual environments,
caches, `node_modules`); a session's sandbox holds one checkout, so at most one directory.

Every refusal names the path and what to do, before any request (nothing is stored).
"""

import io
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_DOCUMENT_BYTES = 10 * 1024 * 1024  # the gateway's limit (fleet_gateway.routes.documents)
MAX_CHECKOUT_BYTES = 50 * 1024 * 1024
MAX_CHECKOUT_FILES = 2000
MAX_PATHS = 100  # context paths and document ids one message may name
SKIPPED_DIRS = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache",
     ".pytest_cache", ".ruff_cache", ".tox", ".fleet"}
)  # fmt: skip
_NOT_ALIAS = re.compile(r"[^A-Za-z0-9_-]+")


class ContextError(ValueError):
    """A --context path that cannot be sent; the message names it and what to do."""


@dataclass(frozen=True)
class Document:
    alias: str
    path: Path
    data: bytes
    media_type: str


@dataclass(frozen=True)
class Checkout:
    root: Path
    bundle: bytes
    files: tuple[str, ...]
    size: int


@dataclass
class Context:
    documents: list[Document] = field(default_factory=list)
    checkout: Checkout | None = None

    @property
    def document_ids(self) -> list[str]:
        return [doc.alias for doc in self.documents]

    @property
    def context_paths(self) -> list[str]:
        """The checkout's files, or `.` (all of it) when there are more than a message names."""
        if self.checkout is None:
            return []
        files = list(self.checkout.files)
        return files if len(files) <= MAX_PATHS else ["."]


def alias_of(path: Path, taken: set[str]) -> str:
    stem = _NOT_ALIAS.sub("-", path.name.rsplit(".", 1)[0] if "." in path.name[1:] else path.name)
    base = stem.strip("-_")[:60] or "document"
    alias, n = base, 2
    while alias in taken:
        alias, n = f"{base}-{n}", n + 1
    taken.add(alias)
    return alias


def _document(path: Path, taken: set[str]) -> Document:
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise ContextError(
                f"--context {path}: {size} bytes, over the gateway's document limit of "
                f"{MAX_DOCUMENT_BYTES}: pass the part that matters, or its directory"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise ContextError(f"--context {path}: cannot read it ({exc.strerror})") from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContextError(
            f"--context {path}: not UTF-8 text (byte {exc.start}); the gateway takes text "
            "documents: pass a text export of it"
        ) from None
    return Document(alias_of(path, taken), path, data, "text/plain")


def _checkout(root: Path) -> Checkout:
    buffer = io.BytesIO()
    files: list[str] = []
    total = 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for directory, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            for name in sorted(names):
                path = Path(directory) / name
                if path.is_symlink() or not path.is_file():
                    continue  # the gateway takes regular files only
                relative = path.relative_to(root).as_posix()
                total += path.stat().st_size
                if total > MAX_CHECKOUT_BYTES or len(files) >= MAX_CHECKOUT_FILES:
                    raise ContextError(
                        f"--context {root}: more than {MAX_CHECKOUT_BYTES} bytes or "
                        f"{MAX_CHECKOUT_FILES} files (build outputs and data left in?): pass "
                        "a smaller directory"
                    )
                archive.add(path, arcname=relative, recursive=False)
                files.append(relative)
    if not files:
        raise ContextError(f"--context {root}: the directory holds no regular file to send")
    return Checkout(root, buffer.getvalue(), tuple(files), total)


def gather(paths: list[Path]) -> Context:
    """The documents and the checkout `paths` name, read and checked here."""
    context = Context()
    taken: set[str] = set()
    if len(paths) > MAX_PATHS:
        raise ContextError(f"{len(paths)} --context paths: at most {MAX_PATHS} in one message")
    for path in paths:
        if path.is_dir():
            if context.checkout is not None:
                raise ContextError(
                    f"--context {path}: a second directory (after {context.checkout.root}); "
                    "the session's sandbox holds one checkout: pass their common parent"
                )
            context.checkout = _checkout(path)
        elif path.exists():
            context.documents.append(_document(path, taken))
        else:
            raise ContextError(f"--context {path}: no such file or directory")
    return context
