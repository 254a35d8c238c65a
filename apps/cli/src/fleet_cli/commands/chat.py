"""`fleet chat`: a terminal conversation over the WebSocket. Ctrl-C during a turn cancels that
turn (the mesh records `turn.cancelled` with what it had); a second Ctrl-C, or one at the
prompt, leaves. A dropped socket is resumed from the last sequence seen."""

import asyncio
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from fleet_cli.client import MODES, TurnResult
from fleet_cli.commands.common import DEFAULT_DATA_DIR, DataDir, call, err, fail, gateway
from fleet_cli.progress import delta_line, describe
from fleet_events import new_id
from fleet_events.ids import InvalidId, check_id

PROMPT = "you> "
LEAVE = 130  # the shell's status for a process ended by SIGINT


class _Cursor:
    """Whether streamed answer tokens left the terminal's cursor mid-line: the next event line
    (stderr, the same terminal) and the turn's answer then start on a line of their own."""

    mid_line = False

    @classmethod
    def end_line(cls) -> None:
        if cls.mid_line:
            sys.stdout.write("\n")
            sys.stdout.flush()
            cls.mid_line = False


def _show(frame: dict[str, Any]) -> None:
    kind = frame.get("type")
    if line := delta_line(frame):
        _Cursor.end_line()
        err.print(f"[dim]{escape(line)}[/]", soft_wrap=True)
        return
    if kind == "delta":
        text = str(frame.get("text", ""))
        sys.stdout.write(text)
        sys.stdout.flush()
        if text:
            _Cursor.mid_line = not text.endswith("\n")
        return
    _Cursor.end_line()
    if kind == "event":
        err.print(f"[dim]{escape(describe(frame))}[/]", soft_wrap=True)
    elif kind == "dropped":
        err.print(f"[yellow]· socket dropped; resuming after seq {frame.get('after_seq')}[/]")


async def _turn(data_dir: Path, message: str, mode: str, session: str) -> TurnResult | None:
    """One turn; None when a second Ctrl-C asks to leave."""
    loop = asyncio.get_running_loop()
    cancel, leave = asyncio.Event(), asyncio.Event()

    def interrupted() -> None:
        if cancel.is_set():
            leave.set()
            return
        cancel.set()
        err.print("[yellow]· cancelling the turn (Ctrl-C again to leave)[/]")

    loop.add_signal_handler(signal.SIGINT, interrupted)
    try:
        async with gateway(data_dir) as gw:
            running = asyncio.ensure_future(
                gw.run_turn(message, mode=mode, session=session, on_frame=_show, cancel=cancel)
            )
            leaving = asyncio.ensure_future(leave.wait())
            done, _ = await asyncio.wait({running, leaving}, return_when=asyncio.FIRST_COMPLETED)
            if running not in done:
                running.cancel()
                return None
            leaving.cancel()
            return running.result()
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def chat_command(
    session: Annotated[str | None, typer.Option(help="continue this session")] = None,
    mode: Annotated[str, typer.Option(help="auto | rlm_only | tools_only")] = "auto",
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Chat with the agent; answers stream as they come. Ctrl-C cancels a turn, twice leaves."""
    if mode not in MODES:
        raise fail(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    try:
        sid = check_id("session", session) if session else new_id()
    except InvalidId as exc:
        raise fail(str(exc)) from None
    err.print(f"[dim]session {sid} (Ctrl-C cancels a turn, Ctrl-D leaves)[/]")
    while True:
        try:
            message = input(PROMPT)
        except (EOFError, KeyboardInterrupt):
            sys.stdout.write("\n")
            return
        if not message.strip():
            continue
        result = call(_turn(data_dir, message, mode, sid))
        _Cursor.end_line()
        if result is None:
            raise typer.Exit(LEAVE)
        if result.status == "completed":
            sys.stdout.write(f"fleet> {result.answer}\n")
        else:
            partial = f" (partial: {result.answer})" if result.answer else ""
            err.print(f"[yellow]turn {result.status}[/]{partial} {result.error}", soft_wrap=True)
        sys.stdout.flush()
