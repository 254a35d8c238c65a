"""What a turn's request names beside its message (`TurnRequested.document_ids`,
`context_paths`: `fleet run --context`, the WebSocket `message` frame), made into text the
turn's modules see.

The named documents' text is read from the object store and put after the message, each under a
header naming it (worded so that an attached text alone does not send the turn to the tools:
the escalation rule's tool words are for what only a tool can reach); the named sandbox paths
are listed for the agent to read with code (they are files of the checkout the session's
sandbox was given), and a named repository (`TurnRequested.repo_url` at `repo_ref`) with the
path the broker cloned it to (`repo/`). The message and the block together are
the turn's question: ChainOfThought and ReAct read them as the question, the RLM route as its
task, and the escalation rule counts their characters (a document past the context threshold
goes to the RLM, as a long message does). A `tools_only` turn cannot reach the RLM, so there a
document past the threshold is named, not put in, and ReAct reads it with the document tools.
"""

import builtins
import csv
import io
import keyword
import logging
import re
import unicodedata
from dataclasses import dataclass

from fleet_agent.chat.documents import text_of
from fleet_events.session import DocumentRef, TurnRequested
from fleet_mesh.blobs import BlobNotFound, JetStreamBlobs

log = logging.getLogger("fleet.agent.chat")
MAX_LISTED_PATHS = 100
REPO_DIR = "repo"
"""Where the broker clones a `repo_url`: `repo/` of the sandbox's working directory."""


def block(
    documents: list[tuple[DocumentRef, str]], missing: list[str], paths: tuple[str, ...],
    *, max_chars: int | None = None, repo: tuple[str, str | None] | None = None,
) -> str:  # fmt: skip
    """The text that follows the message (empty when the request names nothing). Pure.

    With `max_chars` (a turn that may not reach the RLM: `tools_only`), documents are put in
    whole only while their text fits in it; the rest are named for the document tools. `repo`
    (the request's `repo_url`, `repo_ref`) is named with its checkout path, `REPO_DIR`."""
    parts = []
    if repo is not None:
        url, repo_ref = repo
        at = f"at {repo_ref!r}" if repo_ref else "at its default branch"
        parts.append(
            f"[repository {url!r} {at}, checked out in the session sandbox's working directory "
            f"under {REPO_DIR}/ (read its files with code, e.g. open('{REPO_DIR}/README.md'))]"
        )
    room = max_chars
    for ref, text in documents:
        header = f"[attached {ref.alias!r} ({ref.origin[:200]}, {len(text)} characters)"
        if room is not None and len(text) > room:
            parts.append(
                f"{header}: {TOO_LONG}; read it with the document tools "
                f"(read_file_slice, find_in_document) as {ref.alias!r}]"
            )
            continue
        room = None if room is None else room - len(text)
        parts.append(f"{header}]\n{text}\n[end of {ref.alias!r}]")
    for alias in missing:
        parts.append(f"[attached {alias!r} was named but is not loaded in this session]")
    if paths:
        listed = ", ".join(paths[:MAX_LISTED_PATHS])
        more = f" and {len(paths) - MAX_LISTED_PATHS} more" if len(paths) > MAX_LISTED_PATHS else ""
        parts.append(
            "[context files, in the session sandbox's working directory (read them with code): "
            f"{listed}{more}]"
        )
    return "\n\n" + "\n\n".join(parts) if parts else ""


TOO_LONG = "too long to include here"

_HEADER = re.compile(r"\[attached '((?:[^'\\]|\\.)*)' \((.*?), (\d+) characters\)\]\n")
PREVIEW_LINES = 3
PREVIEW_CHARS = 240


def documents_in(block_text: str) -> list[tuple[str, str, str]]:
    """`(alias, origin, text)` of each document `block` put in whole, its text sliced by the
    length its header states (so a text holding header-like lines cannot confuse it). Pure."""
    found = []
    at = 0
    while (header := _HEADER.search(block_text, at)) is not None:
        start = header.end()
        text = block_text[start : start + int(header.group(3))]
        found.append((header.group(1).replace("\\'", "'"), header.group(2), text))
        at = start + len(text)
    return found


_PATHS = re.compile(
    r"\[context files, in the session sandbox's working directory \(read them with code\): "
    r"(.*?)(?: and \d+ more)?\]$",
    re.M,
)
FILE_VARIABLES = 5
"""At most this many named files are read into variables of their own for the code route."""
FILE_VARIABLE_CHARS = 10_000_000


@dataclass(frozen=True)
class CodeInputs:
    """What the code route's cell gets: `variables` sent with it, `prelude` run before the
    model's code (reading named files into variables), and `described`, how its prompt names
    them all."""

    variables: dict[str, str]
    prelude: str
    described: str


TABLE_MAX_COLUMNS = 50
DESCRIBED_COLUMNS = 20
"""At most this many of a table's keys are named in the prompt, each cut to 40 characters."""
_ROWS_PRELUDE = [
    "import csv as _fleet_csv, io as _fleet_io, re as _fleet_re",
    "_fleet_int = _fleet_re.compile(r'-?(0|[1-9][0-9]*)')",
    "_fleet_float = _fleet_re.compile(",
    "    r'-?((0|[1-9][0-9]*)([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?')",
    "def _fleet_value(v):",
    "    if _fleet_int.fullmatch(v):",
    "        return int(v)",
    "    if _fleet_float.fullmatch(v):",
    "        return float(v)",
    "    return v",
]
"""Defines what reads an attached table's rows in the sandbox: a plain integer (no leading
zero: "007" is a code, not 7) or decimal becomes a number; anything else ("nan", "inf", a
name) stays text."""


def _csv_rows(text: str) -> list[list[str]]:
    """`text`'s rows as the prelude's `csv.DictReader` over `io.StringIO(text)` reads them."""
    return list(csv.reader(io.StringIO(text)))


def table_columns(text: str) -> list[str] | None:
    """The header of `text` when it is a CSV table (its first line a header of 2 to
    `TABLE_MAX_COLUMNS` distinct non-empty names, at least one row, every row as wide as the
    header; blank lines between rows are skipped, as `csv.DictReader` skips them), else None.
    Parsed exactly as the prelude parses it, so what the prompt promises is what the cell
    gets. Pure: only the code route's prompt and prelude depend on it, never the text."""
    try:
        rows = _csv_rows(text)
    except csv.Error:  # e.g. a bare carriage return between lines: the prelude would fail
        return None
    if len(rows) < 2:
        return None
    header, body = rows[0], [row for row in rows[1:] if row]
    if not 2 <= len(header) <= TABLE_MAX_COLUMNS or not all(cell.strip() for cell in header):
        return None
    if not body or len(set(header)) != len(header) or any(len(r) != len(header) for r in body):
        return None
    return header


_RESERVED = frozenset(dir(builtins))
"""A variable named like a builtin (a document called `int`) would shadow it in the cell."""


def _name(wanted: str, taken: dict[str, str], fallback: str) -> str:
    """A Python name for `wanted` not in `taken`: as Python reads source (NFKC), else
    `fallback` (made unique with a number)."""
    name = re.sub(r"\W", "_", unicodedata.normalize("NFKC", wanted))
    ok = name.isidentifier() and not keyword.iskeyword(name)
    if ok and name not in taken and name not in _RESERVED and not name.startswith("_fleet"):
        return name
    candidate, n = fallback, 1
    while candidate in taken:
        n += 1
        candidate = f"{fallback}_{n}"
    return candidate


def code_variables(block_text: str) -> CodeInputs:
    """What the code route's cell gets and how its prompt names it: `context` (everything
    attached, as the other modules read it), each whole document under a name of its own (its
    alias when that is a Python name, else `document_N`) with its size and first lines, and
    each named sandbox file (the first `FILE_VARIABLES`) read into a variable named after it
    by the cell's prelude, so a small model writes code against the variables as they exist
    (it counted the words of the file *list* when only `context` was there). An attached
    document that is a CSV table (`table_columns`) also comes as `<name>_rows`, its rows as
    dicts with numbers parsed, made by the prelude from the text (the 0.5B model summed a
    column by splitting lines and indexing strings). Pure."""
    if not block_text:
        return CodeInputs({}, "", "none")
    variables = {"context": block_text}
    read: dict[str, str] = dict(variables)  # every name the cell will have, sent or made
    lines = []
    tables: list[tuple[str, str, list[str]]] = []
    for n, (alias, origin, text) in enumerate(documents_in(block_text), start=1):
        name = _name(alias, read, f"document_{n}")
        variables[name] = read[name] = text
        head = "\n".join(text.splitlines()[:PREVIEW_LINES])[:PREVIEW_CHARS]
        lines.append(
            f"{name}: str, the attached document {alias!r} ({origin}) alone, {len(text)} "
            f"characters, {len(text.splitlines())} lines; it begins: {head!r}"
        )
        if (columns := table_columns(text)) is not None:
            tables.append((name, f"rows_{n}", columns))
    # the documents keep their own names first; a table's rows get one no document took
    tables = [(name, _name(f"{name}_rows", read, fallback), c) for name, fallback, c in tables]
    read.update((rows, rows) for _, rows, _ in tables)
    prelude = []
    listed = _PATHS.search(block_text)
    paths = listed.group(1).split(", ")[:FILE_VARIABLES] if listed else []
    for n, path in enumerate(paths, start=1):
        name = _name(path.rsplit("/", 1)[-1].split(".", 1)[0], read, f"file_{n}")
        read[name] = path
        prelude.append(
            f"{name} = open({path!r}, encoding='utf-8', errors='replace')"
            f".read({FILE_VARIABLE_CHARS})"
        )
        lines.append(
            f"{name}: str, the text of the file {path!r} in the working directory (already "
            "read for you)"
        )
    if tables:
        prelude.extend(_ROWS_PRELUDE)
    for source, rows, columns in tables:
        prelude.append(
            f"{rows} = [{{k: _fleet_value(v) for k, v in row.items()}} "
            f"for row in _fleet_csv.DictReader(_fleet_io.StringIO({source}))]"
        )
        keys = ", ".join(repr(c[:40]) for c in columns[:DESCRIBED_COLUMNS])
        if len(columns) > DESCRIBED_COLUMNS:
            keys += f" and {len(columns) - DESCRIBED_COLUMNS} more"
        lines.append(
            f"{rows}: list of dict, {source} read as CSV: one dict per row, keys {keys}, "
            f"numbers already int or float (e.g. [row[{columns[-1][:40]!r}] for row in {rows}])"
        )
    lines.append(
        f"context: str, {len(block_text)} characters, everything attached together "
        "(documents between [attached ...] and [end of ...] lines; files named in it are in "
        "the working directory)"
    )
    return CodeInputs(variables, "\n".join(prelude), "\n".join(lines))


def in_sandbox(request: TurnRequested | None, block_text: str) -> bool:
    """Is some of the turn's context reachable only with tools (named sandbox paths, a
    repository, a document named but not put in the prompt)? Then ChainOfThought, which has
    no tools, is no fallback for it (`escalation.fallback_from`). Pure."""
    if request is None:
        return False
    return bool(request.context_paths or request.repo_url) or TOO_LONG in block_text


async def read_context(
    blobs: JetStreamBlobs, tenant: str, request: TurnRequested | None,
    documents: dict[str, DocumentRef], *, max_chars: int | None = None,
) -> str:  # fmt: skip
    """The block for `request`, reading each named document's text (on the bus loop); a
    `tools_only` turn gets at most `max_chars` of document text put in whole."""
    if request is None or not (request.document_ids or request.context_paths or request.repo_url):
        return ""
    found: list[tuple[DocumentRef, str]] = []
    missing: list[str] = []
    for alias in request.document_ids:
        ref = documents.get(alias)
        if ref is None:
            missing.append(alias)
            continue
        try:
            data = await blobs.get(tenant, ref.blob.sha256)
        except BlobNotFound:
            log.warning("a named document's text is gone", extra={"alias": alias})
            missing.append(alias)
            continue
        found.append((ref, text_of(data, ref.media_type, ref.origin)[0]))
    room = max_chars if request.mode == "tools_only" else None
    repo = (request.repo_url, request.repo_ref) if request.repo_url else None
    return block(found, missing, request.context_paths, max_chars=room, repo=repo)
