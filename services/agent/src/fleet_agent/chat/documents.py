"""Documents as the chat agent holds them: text in the object store, a `DocumentRef` in the
session, and the pure views the tools give of that text (a slice, a search, chunks).

A document's bytes become text once, when loaded (PDF via pypdf, anything else decoded as
UTF-8); every later read fetches that text by its digest, so the session's state stays small
and a restored session reads the same text.
"""

import io
import re
from dataclasses import dataclass

import pypdf
import pypdf.errors

from fleet_agent.run.failures import InputError
from fleet_events.envelope import BlobRef
from fleet_events.session import DocumentRef

ALIAS = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SLICE_LINES = 200
FIND_HITS = 20
CHUNK_CHARS = 4_000


class DocumentError(InputError):
    """A document could not be loaded or read; the message says why and what to do."""


def text_of(data: bytes, media_type: str, origin: str) -> tuple[str, str]:
    """The text of a document's bytes, and the media type it was read as."""
    if data.startswith(b"%PDF-") or media_type == "application/pdf":
        try:
            reader = pypdf.PdfReader(io.BytesIO(data))
            pages = [page.extract_text() or "" for page in reader.pages]
        except (pypdf.errors.PyPdfError, ValueError, KeyError) as exc:
            raise DocumentError(
                f"{origin[:200]!r} looks like a PDF but cannot be read ({type(exc).__name__}): "
                "upload a text export of it instead"
            ) from None
        return "\n\n".join(pages), "application/pdf"
    return data.decode("utf-8", errors="replace"), media_type or "text/plain"


def alias_for(origin: str, wanted: str) -> str:
    """The alias a document is known by: the one asked for, or its origin's last part."""
    if wanted:
        if ALIAS.fullmatch(wanted) is None:
            raise DocumentError(
                f"alias {wanted[:80]!r} is not usable: use 1 to 64 letters, digits, '_', '-' or '.'"
            )
        return wanted
    tail = re.sub(r"[^A-Za-z0-9_.-]+", "-", origin.rstrip("/").rsplit("/", 1)[-1]).strip("-.")
    return (tail or "document")[:64]


def reference(
    alias: str, source: str, origin: str, blob: BlobRef, text: str, media: str
) -> DocumentRef:
    return DocumentRef(
        alias=alias, source=source, origin=origin, blob=blob, chars=len(text), media_type=media,
        title=origin.rstrip("/").rsplit("/", 1)[-1][:200],
    )  # fmt: skip


def read_slice(text: str, start_line: int, num_lines: int) -> str:
    """Lines `start_line` (1-based) onwards, numbered, as the earlier `read_file_slice` gave."""
    lines = text.splitlines()
    if start_line < 1:
        raise DocumentError(f"start_line {start_line} is before the first line: lines start at 1")
    if start_line > max(len(lines), 1):
        raise DocumentError(
            f"start_line {start_line} is past the end: the text has {len(lines)} lines"
        )
    count = max(1, min(num_lines, SLICE_LINES))
    chosen = lines[start_line - 1 : start_line - 1 + count]
    body = "\n".join(f"{start_line + i}: {line}" for i, line in enumerate(chosen))
    return f"{body}\n[lines {start_line}-{start_line + len(chosen) - 1} of {len(lines)}]"


def find(text: str, pattern: str, *, regex: bool = False) -> str:
    """The lines that match, numbered (at most `FIND_HITS`)."""
    try:
        matcher = re.compile(pattern if regex else re.escape(pattern), re.IGNORECASE)
    except re.error as exc:
        raise DocumentError(
            f"pattern {pattern[:80]!r} is not a valid regular expression: {exc}"
        ) from None
    hits = [f"{n}: {line}" for n, line in enumerate(text.splitlines(), 1) if matcher.search(line)]
    if not hits:
        return f"no line matches {pattern[:80]!r}"
    more = f"\n[{len(hits) - FIND_HITS} more]" if len(hits) > FIND_HITS else ""
    return "\n".join(hits[:FIND_HITS]) + more


@dataclass(frozen=True)
class Chunk:
    index: int
    start: int
    end: int
    preview: str


def chunks(text: str, size: int = CHUNK_CHARS) -> list[Chunk]:
    """Cut at paragraph breaks near `size` characters, so a chunk is a readable unit."""
    size = max(200, size)
    out: list[Chunk] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            cut = text.rfind("\n\n", start + size // 2, end)
            end = cut + 2 if cut != -1 else end
        out.append(Chunk(len(out), start, end, text[start:end][:120]))
        start = end
    return out
