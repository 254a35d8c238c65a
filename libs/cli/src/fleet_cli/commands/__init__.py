"""The gateway-client commands (`run`, `chat`, `sessions`, `audit`, `token`, `doctor`), kept apart
from `up` and `status`, which start and watch the local processes themselves."""

import typer

from fleet_cli.commands import audit, chat, doctor, run, sessions, token


def register(app: typer.Typer) -> None:
    app.command("run")(run.run_command)
    app.command("chat")(chat.chat_command)
    app.command("token")(token.token_command)
    app.command("doctor")(doctor.doctor_command)
    app.add_typer(sessions.app, name="sessions")
    app.add_typer(audit.app, name="audit")
