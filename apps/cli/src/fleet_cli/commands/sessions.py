"""`fleet sessions`: the gateway's session routes, with ids checked here first so a typo is
named before any request (and a path-like id can never reach a URL)."""

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from fleet_cli.commands.common import DEFAULT_DATA_DIR, DataDir, call, fail, gateway
from fleet_events.ids import InvalidId, check_id

app = typer.Typer(no_args_is_help=True, help="list, show, export, import, restore, delete")
out = Console(highlight=False)
SessionId = Annotated[str, typer.Argument(help="the session id")]


def _id(value: str) -> str:
    try:
        return check_id("session", value)
    except InvalidId as exc:
        raise fail(str(exc)) from None


def _ask(data_dir: Path, method: str, path: str, **kwargs: Any) -> Any:
    async def go() -> Any:
        async with gateway(data_dir) as gw:
            return await gw.json(method, path, **kwargs)

    return call(go())


@app.command("ls")
def ls_command(
    search: Annotated[str | None, typer.Option(help="title substring or id prefix")] = None,
    status: Annotated[str, typer.Option(help="active | deleted | all")] = "active",
    limit: Annotated[int, typer.Option(help="at most this many (1-100)")] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """The caller's sessions, newest first."""
    params: dict[str, Any] = {"status": status, "limit": limit}
    if search:
        params["search"] = search
    body = _ask(data_dir, "GET", "/api/v1/sessions", params=params)
    if as_json:
        sys.stdout.write(json.dumps(body["items"]) + "\n")
        return
    table = Table(title_justify="left")
    for column in ("id", "title", "status", "turns", "updated"):
        table.add_column(column)
    for item in body["items"]:
        table.add_row(
            item["id"], item.get("title") or "", item.get("status", ""),
            str(item.get("turn_count", "")), item.get("updated_at", ""),
        )  # fmt: skip
    out.print(table)


@app.command("show")
def show_command(session: SessionId, data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """The session and its turns, as JSON."""
    sid = _id(session)
    found = _ask(data_dir, "GET", f"/api/v1/sessions/{sid}")
    found["turns"] = _ask(data_dir, "GET", f"/api/v1/sessions/{sid}/turns")["items"]
    sys.stdout.write(json.dumps(found, indent=2) + "\n")


@app.command("export")
def export_command(
    session: SessionId,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="file (default stdout)")
    ] = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """The session's export (NDJSON) for `fleet audit verify` or `fleet sessions import`."""
    sid = _id(session)

    async def go() -> bytes:
        async with gateway(data_dir) as gw:
            return (await gw.request("POST", f"/api/v1/sessions/{sid}/export")).content

    body = call(go())
    if output is None:
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
    else:
        output.write_bytes(body)


@app.command("import")
def import_command(
    source: Annotated[str, typer.Argument(help="an export file, or - for stdin")],
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Import an export as a new session of the caller's tenant; prints the new id."""
    body = sys.stdin.buffer.read() if source == "-" else _read(Path(source))
    answer = _ask(
        data_dir, "POST", "/api/v1/sessions/import", content=body,
        headers={"Content-Type": "application/x-ndjson"},
    )  # fmt: skip
    sys.stdout.write(str(answer["session_id"]) + "\n")


@app.command("restore")
def restore_command(
    session: SessionId,
    upto_seq: Annotated[int | None, typer.Option(help="the state as of this sequence")] = None,
    reason: Annotated[str, typer.Option(help="recorded with the restore")] = "",
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Record the session's state (as of --upto-seq) as restored; prints the gateway's answer."""
    body: dict[str, Any] = {"reason": reason}
    if upto_seq is not None:
        body["upto_seq"] = upto_seq
    answer = _ask(data_dir, "POST", f"/api/v1/sessions/{_id(session)}/restore", json=body)
    sys.stdout.write(json.dumps(answer) + "\n")


@app.command("rm")
def rm_command(session: SessionId, data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """Delete (tombstone) a session: its log stays, as the audit needs."""
    _ask(data_dir, "DELETE", f"/api/v1/sessions/{_id(session)}")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise fail(f"cannot read {path}: {exc.strerror}") from None
