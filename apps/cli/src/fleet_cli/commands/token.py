"""`fleet token`: a development token for tools that are not this CLI (curl, the UI)."""

import sys
from typing import Annotated

import typer

from fleet_cli.commands.common import DEFAULT_DATA_DIR, DataDir, fail
from fleet_cli.errors import ClientError
from fleet_cli.localmesh import mesh_dir, mint_token
from fleet_events.ids import InvalidId, check_id


def token_command(
    tenant: Annotated[str, typer.Option(help="the token's tenant")] = "dev",
    user: Annotated[str, typer.Option(help="the token's user")] = "dev",
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Print a 30-day admin token signed with the local gateway's secret (stdout only)."""
    try:
        check_id("tenant", tenant)
        check_id("user", user)
    except InvalidId as exc:
        raise fail(str(exc)) from None
    try:
        sys.stdout.write(mint_token(mesh_dir(data_dir), tenant=tenant, user=user) + "\n")
    except ClientError as exc:
        raise fail(str(exc)) from None
