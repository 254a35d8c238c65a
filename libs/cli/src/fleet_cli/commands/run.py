"""`fleet run`: one question, one answer, an exit status a script can branch on."""

import json
import sys
from typing import Annotated, Any

import typer

from fleet_cli.client import MODES, TurnResult
from fleet_cli.commands.common import (
    DEFAULT_DATA_DIR,
    EXIT_FAILED,
    EXIT_REFUSED,
    DataDir,
    call,
    err,
    fail,
    gateway,
)


def _progress(frame: dict[str, Any]) -> None:
    kind = frame.get("type")
    if kind == "accepted":
        err.print(f"[dim]· accepted: session {frame.get('session_id')}[/]")
    elif kind == "event":
        data = (frame.get("event") or {}).get("data") or {}
        err.print(f"[dim]· {data.get('type')}[/]")
    elif kind == "delta":
        err.print(str(frame.get("text", "")), end="", markup=False)


def run_command(
    question: Annotated[str, typer.Argument(help="the message for the agent")],
    mode: Annotated[str, typer.Option(help="auto | rlm_only | tools_only")] = "auto",
    session: Annotated[
        str | None, typer.Option(help="continue this session (default: a new one)")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the turn's events as JSON")
    ] = False,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Ask once over the WebSocket: progress on stderr, the answer alone on stdout; exit 0
    completed, 1 failed or cancelled, 3 refused, 2 bad input or no mesh."""
    if mode not in MODES:
        raise fail(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    if not question.strip():
        raise fail("the question is empty: pass the message as the first argument")

    async def go() -> TurnResult:
        async with gateway(data_dir) as gw:
            show = (lambda _: None) if as_json else _progress
            return await gw.run_turn(question, mode=mode, session=session, on_frame=show)

    result = call(go())
    if as_json:
        out = {
            "session": result.session, "turn": result.turn, "status": result.status,
            "answer": result.answer, "error": result.error,
            "events": [frame["event"] for frame in result.events],
        }  # fmt: skip
        sys.stdout.write(json.dumps(out) + "\n")
    elif result.status == "completed":
        sys.stdout.write(result.answer + "\n")
    else:
        err.print(f"[red]turn {result.status}:[/] {result.error}", soft_wrap=True)
    if result.status == "completed":
        return
    raise typer.Exit(EXIT_REFUSED if result.status == "refused" else EXIT_FAILED)
