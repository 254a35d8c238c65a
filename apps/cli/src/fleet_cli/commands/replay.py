"""`fleet replay SESSION|FILE`: re-execute a session's recorded cells offline, in a fresh local
sandbox, with the recorded model responses, and say whether the record reproduces
(fleet_cli.replay; docs/replay.md)."""

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fleet_cli.commands.common import DEFAULT_DATA_DIR, EXIT_FAILED, DataDir, call, fail, gateway

out = Console(highlight=False)


def replay_command(
    source: Annotated[str, typer.Argument(help="a session id, an export file, or - for stdin")],
    keys: Annotated[
        Path | None,
        typer.Option(
            help="pinned key set (<data-dir>/keys/keyset.json): every signature and "
            "the export's seal are checked before any cell runs"
        ),
    ] = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Replay every recorded cell offline (no model is called); exit 0 when the session
    reproduces (differences in cells that read the clock or randomness are named, not
    failures), 1 at the first step that diverges, 2 for input that is not a session or does
    not verify (the export is checked as `fleet audit verify` checks it before any cell runs)."""
    import sys

    from fleet_cli.commands.audit import pinned_keys
    from fleet_cli.replay import ReplayError, replay_lines

    pinned = pinned_keys(keys)
    if source == "-":
        body = sys.stdin.buffer.read()
    elif Path(source).is_file():
        body = Path(source).read_bytes()
    else:
        body = _fetch(source, data_dir)
    try:
        report = asyncio.run(replay_lines(body.splitlines(), keys=pinned))
    except ReplayError as exc:
        raise fail(f"{source}: {exc}") from None
    for step in report.steps:
        indent = "  " * step.depth
        detail = f": {step.detail}" if step.detail else ""
        out.print(f"{indent}{step.status:<16} run {step.run} cell {step.position}{detail}")
    diverged = report.diverged
    cells = len(report.steps)
    if diverged is not None:
        out.print(
            f"[red]diverged[/] at run {diverged.run} cell {diverged.position} "
            f"({diverged.cell_id}): {diverged.detail}"
        )
        raise typer.Exit(EXIT_FAILED)
    odd = report.nondeterministic
    note = f"; {len(odd)} legitimately nondeterministic (named above)" if odd else ""
    out.print(f"[green]reproduced[/]: {cells} cells in {report.runs} runs{note}")


def _fetch(session: str, data_dir: Path) -> bytes:
    from fleet_events import InvalidId, check_id

    try:
        sid = check_id("session", session)
    except InvalidId as exc:
        raise fail(f"{session} is neither a file nor a session id: {exc}") from None

    async def go() -> bytes:
        async with gateway(data_dir) as gw:
            return (await gw.request("POST", f"/api/v1/sessions/{sid}/export")).content

    return call(go())
