"""`fleet audit verify`: an export checked on this machine by the store's own rule, so the
verdict never depends on the server that produced the export."""

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
from fleet_events.ids import InvalidId, check_id
from fleet_events.signing import KeySet
from fleet_mesh.store import verify_export

app = typer.Typer(no_args_is_help=True, help="verify exports offline")


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


def _is_blob(line: bytes) -> bool:
    """A blob line carries an object-store payload, not an event: the chain does not cover it
    (its digest is named by the event that references it)."""
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
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise fail(f"--keys {path}: not a key set ({exc})") from None


@app.command("verify")
def verify_command(
    source: Annotated[str, typer.Argument(help="an export file, - for stdin, or a session id")],
    keys: Annotated[
        Path | None, typer.Option(help="pinned key set (JSON): also check every signature")
    ] = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Exit 0 when every chain holds; else name the first bad event and exit 1. A session id
    is exported through the gateway first; the check itself needs no server."""
    lines = [line for line in _lines(source, data_dir) if line.strip()]
    events = [line for line in lines if not _is_blob(line)]
    pinned = _keys(keys)
    verdict = verify_export(events, keys=pinned)
    if verdict.fault is not None:
        err.print(f"[red]export does not verify:[/] {verdict.fault}", soft_wrap=True)
        raise typer.Exit(EXIT_FAILED)
    if not verdict.checked:
        raise fail("the export holds no event", EXIT_FAILED)
    signed = (
        "signatures and chains"
        if pinned is not None
        else "chains only (pass --keys to check signatures)"
    )
    err.print(f"[green]verified[/]: {verdict.checked} events, {signed}")
