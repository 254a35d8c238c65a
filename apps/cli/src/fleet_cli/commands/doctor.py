"""`fleet doctor`: every part the mesh needs, each with what to do when it is down, so a
failed check is a next step rather than a stack trace.

The embedded model is reported from `/ready`'s `llm` component (its install step, or up with
its speed, and whether its server answers); with no gateway to ask — a failed build stops
`fleet up` — from the state `fleet up` left in `<data-dir>/llm/state.json`.
"""

import os
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from fleet_cli.client import Gateway, Target, find_target
from fleet_cli.commands.common import DEFAULT_DATA_DIR, DataDir, call
from fleet_cli.errors import ClientError
from fleet_cli.localllm.state import read_file
from fleet_cli.localmesh import NoMesh, mesh_dir, recorded_gateway
from fleet_events.llm import local_state_line

out = Console(highlight=False)

ADVICE = {
    "nats": "NATS is down: `fleet up` restarts it; if it keeps failing read <data-dir>/logs/"
    "fleet-up.log (a port in use? try --nats-port 0)",
    "service": "read <data-dir>/logs/{name}.log for its last error; `fleet up` restarts a "
    "service that exits",
    "store": "run the bootstrap: restart `fleet up`, which creates every stream and bucket",
    "llm": "the embedded model: its log is <data-dir>/logs/llm.log (install logs in "
    "~/.cache/fleet-rlm/logs); `fleet up --llm none` runs without it, FLEET_LLM_MODEL points "
    "the mesh at a real model (docs/local-llm.md)",
    "provider": "{name}'s API is failing (its circuit is open, so sandbox calls to it fail "
    "fast): check DAYTONA_API_KEY, DAYTONA_API_URL and DAYTONA_TARGET given to the sandbox "
    "broker and the service's status; sessions on the local provider are not affected",
}
DAYTONA_OFF = (
    "not configured: sandboxes run on the local provider (the broker uses Daytona when "
    "DAYTONA_API_KEY, DAYTONA_API_URL and DAYTONA_TARGET are set)"
)


def _advice(item: dict[str, Any]) -> str:
    kind = str(item.get("kind"))
    if kind in ("nats", "service", "provider", "llm"):
        return ADVICE[kind].format(name=item.get("name"))
    return ADVICE["store"]


Row = tuple[str, bool, str, str]  # check, up, detail, what to do


def component_rows(components: list[dict[str, Any]]) -> list[Row]:
    """One row per component `/ready` named, with what to do for each that is not up; Daytona
    named even when the broker does not use it (not in use is not a fault)."""
    rows: list[Row] = []
    for item in components:
        up = item.get("state") == "up"
        detail = str(item.get("detail") or item.get("replica") or "")
        rows.append((str(item.get("name")), up, detail, "" if up else _advice(item)))
    if components and not any(item.get("name") == "daytona" for item in components):
        rows.append(("daytona", True, DAYTONA_OFF, ""))
    return rows


def last_local_state(directory: Path, *, mesh_runs: bool) -> list[Row]:
    """The embedded model as `fleet up` last wrote it, when the gateway cannot be asked. Its
    "up" holds only while that `fleet up` runs: a stopped mesh's model is stopped with it, so a
    state file it left is never reported as up."""
    found = read_file(directory)
    if found is None:
        return []
    line = f"last written by fleet up: {local_state_line(found)}"
    if found.state == "up" and not mesh_runs:
        line = f"stopped with its mesh (was up: {local_state_line(found)})"
        return [("llm", False, line, "start the mesh again: ./scripts/run or `fleet up`")]
    advice = (found.advice or ADVICE["llm"]) if found.state != "up" else ""
    return [("llm", found.state == "up", line, advice)]


async def _checks(target: Target, env: dict[str, str], data_dir: Path) -> list[Row]:
    rows: list[Row] = []
    async with Gateway(target, timeout=10) as gw:
        try:
            await gw.request("GET", "/health")
        except ClientError as exc:
            down = ("gateway", False, str(exc), "start the mesh: `fleet up` (or set FLEET_URL)")
            runs = recorded_gateway(data_dir) is not None
            return [down, *last_local_state(data_dir / "llm", mesh_runs=runs)]
        rows.append(("gateway", True, f"{target.url} answers /health", ""))
        try:
            me = await gw.json("GET", "/api/v1/auth/me")
            rows.append(("token", True, f"tenant {me.get('tenant')}, user {me.get('user')}", ""))
        except ClientError as exc:
            rows.append(
                ("token", False, str(exc), "mint one with `fleet token` or fix FLEET_TOKEN")
            )
        try:
            components = (await gw.answer("GET", "/ready")).json().get("components", [])
        except (ClientError, ValueError) as exc:
            components = []
            rows.append(
                ("ready", False, f"/ready did not answer JSON ({exc})", "see the gateway log")
            )
        rows += component_rows(components)
    if not any(item.get("kind") == "llm" for item in components):
        rows.append(await _llm(env))  # no local model: probe the endpoint this shell names
    return rows


async def _llm(env: dict[str, str]) -> tuple[str, bool, str, str]:
    """The model endpoint the services were given, if this shell names it (`fleet up` starts
    its local model on 127.0.0.1:8181 unless told otherwise)."""
    base = env.get("FLEET_LLM_API_BASE") or "http://127.0.0.1:8181/v1"
    try:
        async with httpx.AsyncClient(timeout=3) as client:
            response = await client.get(f"{base.rstrip('/')}/models")
    except httpx.HTTPError as exc:
        advice = "start `fleet up` without --llm none, or point FLEET_LLM_API_BASE at a model"
        return ("llm", False, f"{base}: {type(exc).__name__}", advice)
    if response.status_code >= 400:
        return ("llm", False, f"{base}/models answered {response.status_code}",
                "check FLEET_LLM_API_KEY and FLEET_LLM_MODEL (docs/local-llm.md)")  # fmt: skip
    return ("llm", True, f"{base} answers", "")


def doctor_command(data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """Check the gateway, the token, NATS, every stream and service (/ready), and the LLM;
    exit 0 only when all are up."""
    data_dir = mesh_dir(data_dir)
    try:
        target = find_target(data_dir)
    except NoMesh as exc:  # nothing to ask: say so, with what the mesh left behind
        rows = [("gateway", False, str(exc), "start the mesh: ./scripts/run or `fleet up`")]
        rows += last_local_state(data_dir / "llm", mesh_runs=False)
        _table("fleet doctor: no mesh running", rows)
        raise typer.Exit(1) from None
    except ClientError as exc:
        # FLEET_URL without a token, or a running mesh whose gateway made no secret yet
        url = os.environ.get("FLEET_URL") or recorded_gateway(data_dir) or ""
        target = Target(url, "", str(exc))
    rows = call(_checks(target, dict(os.environ), data_dir))
    _table(f"fleet doctor: {target.url}", rows)
    raise typer.Exit(0 if all(up for _, up, _, _ in rows) else 1)


def _table(title: str, rows: list[Row]) -> None:
    table = Table(title=title, title_justify="left")
    for column in ("check", "state", "detail", "what to do"):
        table.add_column(column)
    for name, up, detail, advice in rows:
        table.add_row(name, "[green]up[/]" if up else "[red]down[/]", detail, advice)
    out.print(table)
