"""`fleet run`: one question, one answer, an exit status a script can branch on."""

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from fleet_cli.client import MODES, Gateway, TurnResult
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
from fleet_cli.context import Context, ContextError, gather
from fleet_cli.progress import delta_line, describe
from fleet_events.git import ref_refusal, repo_url_refusal
from fleet_events.ids import InvalidId, check_id


def _progress(frame: dict[str, Any]) -> None:
    kind = frame.get("type")
    if kind == "accepted":
        err.print(f"[dim]· accepted: session {frame.get('session_id')}[/]")
    elif kind == "event":
        err.print(f"[dim]{escape(describe(frame))}[/]", soft_wrap=True)
    elif line := delta_line(frame):
        err.print(f"[dim]{escape(line)}[/]", soft_wrap=True)
    elif kind == "delta":
        err.print(str(frame.get("text", "")), end="", markup=False)


async def _upload(gw: Gateway, session: str, given: Context, *, quiet: bool) -> None:
    for doc in given.documents:
        done = await gw.upload_document(session, doc.alias, doc.path.name, doc.data)
        if not quiet:
            err.print(f"[dim]· document {doc.alias}: {doc.path} ({done['chars']} characters)[/]")
    if given.checkout is not None:
        checkout = given.checkout
        done = await gw.upload_checkout(session, checkout.bundle)
        if not quiet:
            err.print(
                f"[dim]· checkout {checkout.root}: {done['files']} files, {done['bytes']} bytes "
                f"in sandbox {done['sandbox']}[/]"
            )


def _check_repo(repo: str | None, ref: str | None) -> None:
    """`--repo` / `--ref` by the gateway's own rules, so bad input exits 2 before any call."""
    if ref is not None and repo is None:
        raise fail(f"--ref {ref!r} names a ref of no repository: pass --repo URL too")
    why = None if repo is None else repo_url_refusal(repo, allow_local=False)
    why = why or (None if ref is None else ref_refusal(ref))
    if why is not None:
        raise fail(f"--repo/--ref: {why}")


def run_command(
    question: Annotated[str, typer.Argument(help="the message for the agent")],
    mode: Annotated[str, typer.Option(help="auto | rlm_only | tools_only")] = "auto",
    session: Annotated[
        str | None, typer.Option(help="continue this session (default: a new one)")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the turn's events as JSON")
    ] = False,
    context: Annotated[
        list[Path] | None,
        typer.Option(
            "--context",
            help="a text file (a document of the session) or a directory (its sandbox's "
            "checkout) the question is about; repeat for more",
        ),
    ] = None,
    repo: Annotated[
        str | None,
        typer.Option(
            "--repo",
            help="a git repository (https://, ssh:// or git:// URL) the session's sandbox "
            "clones into repo/ for the question",
        ),
    ] = None,
    ref: Annotated[
        str | None, typer.Option("--ref", help="the branch, tag or commit id of --repo")
    ] = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Ask once over the WebSocket: progress on stderr, the answer alone on stdout; exit 0
    completed, 1 failed or cancelled, 3 refused, 2 bad input or no mesh."""
    if mode not in MODES:
        raise fail(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    if not question.strip():
        raise fail("the question is empty: pass the message as the first argument")
    if session is not None:
        try:
            check_id("session", session)
        except InvalidId as exc:
            raise fail(str(exc)) from None
    _check_repo(repo, ref)
    try:
        given = gather(context or [])
    except ContextError as exc:
        raise fail(str(exc)) from None

    async def go() -> TurnResult:
        async with gateway(data_dir) as gw:
            sid = session
            if given.documents or given.checkout is not None:
                sid = sid or await gw.create_session(question.strip()[:80])
                await _upload(gw, sid, given, quiet=as_json)
            show = (lambda _: None) if as_json else _progress
            return await gw.run_turn(
                question, mode=mode, session=sid, on_frame=show,
                document_ids=given.document_ids, context_paths=given.context_paths,
                repo_url=repo, repo_ref=ref,
            )  # fmt: skip

    result = call(go())
    if as_json:
        out = {
            "session": result.session, "turn": result.turn, "status": result.status,
            "answer": result.answer, "error": result.error,
            "answered_by": result.answered_by, "fallback": result.fallback,
            "events": [frame["event"] for frame in result.events],
        }  # fmt: skip
        sys.stdout.write(json.dumps(out) + "\n")
    elif result.status == "completed":
        if result.fallback:  # said before the answer, where a reader of the terminal sees it
            err.print(f"[yellow]note:[/] {escape(result.fallback)}", soft_wrap=True)
        sys.stdout.write(result.answer + "\n")
    else:
        err.print(f"[red]turn {result.status}:[/] {escape(result.error)}", soft_wrap=True)
    if result.status == "completed":
        return
    raise typer.Exit(EXIT_REFUSED if result.status == "refused" else EXIT_FAILED)
