"""`fleet audit verify`: an export checked on this machine by the store's own rule
(`fleet_mesh.offline`, what `EventStore.verify` and the import apply), so the verdict never
depends on the server that produced the export.

With `--keys` (the deployment's `keys/keyset.json`, pinned by the auditor) every signature is
checked too; the key-set line the export carries is shown, never trusted. This module imports
only what the offline check needs: a 10,000-event export verifies in well under the issue's
2 s (bench/cli_verify.py)."""

import base64
import hashlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from fleet_cli.commands.common import (
    DEFAULT_DATA_DIR,
    EXIT_FAILED,
    DataDir,
    call,
    err,
    fail,
    gateway,
)
from fleet_events import subjects
from fleet_events.ids import InvalidId, check_id
from fleet_events.signing import KEYSET_KIND, Checkpoint, KeySet, SigningError
from fleet_mesh.offline import check_lines

app = typer.Typer(no_args_is_help=True, help="verify exports offline")
BLOB_LINE = b'{"kind":"blob"'  # how the gateway writes one (fleet_gateway.bundle.blob_line)


def _lines(source: str, data_dir: Path) -> list[bytes]:
    if source == "-":
        return sys.stdin.buffer.read().splitlines()
    path = Path(source)
    if path.exists():
        try:
            return path.read_bytes().splitlines()
        except OSError as exc:
            raise fail(f"cannot read {path}: {exc.strerror}") from None
    try:
        sid = check_id("session", source)
    except InvalidId:
        raise fail(f"{source!r} is neither a file nor a session id") from None

    async def go() -> bytes:
        async with gateway(data_dir) as gw:
            return (await gw.request("POST", f"/api/v1/sessions/{sid}/export")).content

    return call(go()).splitlines()


def _blob_problem(number: int, line: bytes) -> str | None:
    """A blob line carries an object-store payload, not an event: the chain does not cover it,
    the event naming it does, by digest, so the digest must match (None: it does)."""
    try:
        row = json.loads(line)
        data = base64.b64decode(row["data"], validate=True)
        sha = str(row["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"blob line {number} is unreadable: {exc!r}"
    if hashlib.sha256(data).hexdigest() != sha:
        return f"blob line {number} does not match its sha256 {sha[:16]}…"
    return None


def _is_blob(line: bytes) -> bool:
    if line.startswith(BLOB_LINE):
        return True
    if b'"kind"' not in line:  # the common case: an event line, parsed once, by the check
        return False
    try:
        row = json.loads(line)
    except ValueError:
        return False  # the verifier names an unreadable line with its number
    return isinstance(row, dict) and row.get("kind") == "blob"


def _keys(path: Path | None) -> KeySet | None:
    if path is None:
        return None
    try:
        return KeySet.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise fail(f"--keys {path}: not a key set ({exc})") from None


def _checkpoints(path: Path | None, keys: KeySet | None) -> list[Checkpoint]:
    if path is None:
        return []
    if keys is None:
        raise fail(
            "--checkpoints needs --keys: a checkpoint counts only when signed by the pinned "
            "checkpoint key"
        )
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise fail(f"--checkpoints {path}: cannot read it ({exc.strerror})") from None
    found = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            found.append(Checkpoint.parse(line))
        except SigningError as exc:
            raise fail(f"--checkpoints {path}: line {number} is not a checkpoint ({exc})") from None
    if not found:
        raise fail(f"--checkpoints {path}: the file holds no checkpoint")
    return found


def _session_filter(events: list[bytes]) -> str | None:
    """The filter the export was cut with (its first event's session), for the checkpoints:
    a pinned subject of that session missing from the export is then a fault too."""
    for line in events[:2]:
        try:
            subject = str(json.loads(line)["subject"])
        except (ValueError, KeyError, TypeError):
            continue
        where = subjects.parse_session(subject)
        if where is not None:
            return where.scope
    return None


def _claimed(lines: list[bytes]) -> str:
    """The owners of the keys the export says it was signed with, for the auditor to see."""
    for line in lines[:1]:
        try:
            row = json.loads(line)
        except ValueError:
            return ""
        if isinstance(row, dict) and row.get("kind") == KEYSET_KIND:
            owners = sorted({str(k.get("owner")) for k in row.get("keys") or [] if k})
            return f"; the export names keys of {', '.join(owners) or 'no one'}"
    return ""


@app.command("verify")
def verify_command(
    source: Annotated[str, typer.Argument(help="an export file, - for stdin, or a session id")],
    keys: Annotated[
        Path | None,
        typer.Option(help="pinned key set (JSON: <data-dir>/keys/keyset.json); checks signatures"),
    ] = None,
    checkpoints: Annotated[
        Path | None,
        typer.Option(
            help="signed checkpoints (<data-dir>/checkpoints/SESSIONS.checkpoints.jsonl): every "
            "head they pin must still be there; needs --keys",
        ),
    ] = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Exit 0 when every chain (and with --keys every signature, with --checkpoints every
    pinned head) holds; else name the first bad event and exit 1. A session id is exported
    through the gateway first; the check itself needs no server."""
    pinned = _keys(keys)
    pinned_heads = _checkpoints(checkpoints, pinned)
    lines = [line for line in _lines(source, data_dir) if line.strip()]
    events = []
    for number, line in enumerate(lines, 1):
        if not _is_blob(line):
            events.append(line)
        elif (problem := _blob_problem(number, line)) is not None:
            err.print(f"[red]export does not verify:[/] {problem}", soft_wrap=True)
            raise typer.Exit(EXIT_FAILED)
    within = _session_filter(events) if pinned_heads else None
    checked, fault = check_lines(events, keys=pinned, checkpoints=pinned_heads, within=within)
    if fault is not None:
        err.print(f"[red]export does not verify:[/] {fault}", soft_wrap=True)
        raise typer.Exit(EXIT_FAILED)
    if not checked:
        raise fail("the export holds no event", EXIT_FAILED)
    signed = (
        "signatures and chains against the pinned keys"
        if pinned is not None
        else "chains only (pass --keys to check signatures)"
    )
    if pinned_heads:
        signed += f", and the heads {len(pinned_heads)} checkpoints pinned"
    err.print(f"[green]verified[/]: {checked} events, {signed}{_claimed(lines)}", soft_wrap=True)
