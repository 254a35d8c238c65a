"""The gateway-client commands (`run`, `chat`, `sessions`, `audit`, `token`, `doctor`), kept apart
from `up` and `status`, which start and watch the local processes themselves.

Only the module of the command being run is imported (all of them for `fleet --help`): the
client modules bring httpx, websockets and the gateway's auth, which `fleet audit verify` of a
big export has no use for (bench/cli_verify.py)."""

import importlib
from collections.abc import Sequence

import typer

COMMANDS = {"run": "run_command", "chat": "chat_command", "token": "token_command",
            "doctor": "doctor_command"}  # fmt: skip
GROUPS = ("sessions", "audit")


def wanted(argv: Sequence[str]) -> list[str]:
    """The command modules `argv` needs: the one it names, or every one (help, a typo)."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    if first in COMMANDS or first in GROUPS:
        return [first]
    return [*COMMANDS, *GROUPS]


def register(app: typer.Typer, argv: Sequence[str] | None = None) -> typer.Typer:
    """Add the commands `argv` needs to `app` (every one when `argv` is None), once each."""
    done: set[str] = app.__dict__.setdefault("_fleet_registered", set())
    for name in wanted(()) if argv is None else wanted(argv):
        if name in done:
            continue
        done.add(name)
        module = importlib.import_module(f"fleet_cli.commands.{name}")
        if name in COMMANDS:
            app.command(name)(getattr(module, COMMANDS[name]))
        else:
            app.add_typer(module.app, name=name)
    return app
