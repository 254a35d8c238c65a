"""What every client command shares: where the mesh is, and one way to fail."""

from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

if TYPE_CHECKING:  # imported when used: `fleet audit verify FILE` never talks to a gateway
    from fleet_cli.client import Gateway

T = TypeVar("T")
# Progress and errors on stderr, so stdout carries only what a pipe wants (an answer, JSON).
err = Console(stderr=True, highlight=False)

DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="FLEET_DATA_DIR",
        help="the local mesh's data dir (default: ./.fleet, else the last mesh fleet up started "
        "while it runs; FLEET_URL/FLEET_TOKEN win)",
    ),
]
DEFAULT_DATA_DIR = Path(".fleet")  # fleet_cli.localmesh.DEFAULT_DATA_DIR

EXIT_FAILED = 1
EXIT_USAGE = 2  # bad input, or no mesh to talk to
EXIT_REFUSED = 3


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    err.print(f"[red]error:[/] {message}", soft_wrap=True)
    return typer.Exit(code)


def gateway(data_dir: Path) -> "Gateway":
    from fleet_cli.client import Gateway, find_target
    from fleet_cli.errors import ClientError
    from fleet_cli.localmesh import mesh_dir

    try:
        return Gateway(find_target(mesh_dir(data_dir)))
    except ClientError as exc:
        raise fail(str(exc)) from None


def call(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one client coroutine; a `ClientError` becomes its message and exit status 2."""
    import asyncio

    from fleet_cli.errors import ClientError

    try:
        return asyncio.run(coroutine)
    except ClientError as exc:
        raise fail(str(exc)) from None
