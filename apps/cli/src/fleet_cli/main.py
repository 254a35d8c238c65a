"""`fleet`: start the local mesh (`up`) and ask it how it is (`status`)."""

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from fleet_cli.commands import COMMANDS, register

COMMANDS.setdefault("replay", "replay_command")  # `fleet replay` (issue 13.3, fleet_cli.replay)

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Sequence

    from fleet_cli.localllm.up import LlmOptions
    from fleet_cli.mesh import UpOptions

# What `fleet up` and `fleet status` need (the supervisor, NATS, the local model, httpx) is
# imported inside them: `fleet audit verify` of a big export must not pay half a second of
# imports it never uses (bench/cli_verify.py).
log = logging.getLogger("fleet.up")
app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
# Logs and CI are not terminals: give tables room there instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 120)

DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="FLEET_DATA_DIR",
        help="private NATS store, logs and state of this mesh",
    ),
]


def _logging(log_file: Path) -> None:
    import os

    from rich.logging import RichHandler

    from fleet_mesh.logs import JsonFormatter

    log_file.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_file)
    to_file.setFormatter(JsonFormatter("fleet-up", str(os.getpid())))
    to_console = RichHandler(console=console, show_path=False, markup=False)
    root = logging.getLogger()
    root.handlers[:] = [to_file, to_console]
    root.setLevel(logging.INFO)
    logging.getLogger("nats").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


@app.command("up")
def up_command(
    data_dir: DataDir = Path(".fleet"),
    port: Annotated[int, typer.Option(help="gateway HTTP port on 127.0.0.1")] = 8080,
    nats_port: Annotated[int, typer.Option(help="embedded NATS port; 0 picks a free one")] = 4222,
    llm: Annotated[
        str,
        typer.Option(
            help="local | none | <profile>; default: local unless FLEET_LLM_* or a stored "
            "profile names a model (docs/local-llm.md)"
        ),
    ] = "auto",  # fleet_cli.localllm.up.AUTO (tests/unit/cli/test_cli.py checks they agree)
    llm_port: Annotated[int, typer.Option(help="local LLM server port; 0 picks a free one")] = 8181,
    ready_timeout: Annotated[float, typer.Option(help="seconds to wait for /ready")] = 60.0,
    grace: Annotated[float, typer.Option(help="seconds between SIGTERM and SIGKILL")] = 10.0,
    cluster: Annotated[
        int,
        typer.Option(
            help="nats-server nodes to start (1, 3 or 5), every stream at that many replicas; "
            "with --nats-port P they take ports P to P+3N-1 (docs/deployment.md)"
        ),
    ] = 1,
) -> None:
    """Start NATS (or join $NATS_URL), bootstrap it, run every service; Ctrl-C stops all."""
    import asyncio
    import os

    from fleet_cli.localllm.errors import LocalLlmError
    from fleet_cli.localllm.paths import Cache, default_cache
    from fleet_cli.localllm.up import LlmOptions, LlmUnavailable, check_mode, secrets_env
    from fleet_cli.mesh import CannotStart, UpOptions, preflight
    from fleet_mesh.natsserver import free_port

    try:
        llm = check_mode(llm)
    except LlmUnavailable as exc:
        console.print(f"[red]fleet up cannot start:[/] {exc}")
        raise typer.Exit(2) from None
    from fleet_cli import cluster as nodes

    try:
        size = nodes.check_size(cluster)
    except nodes.BadClusterSize as exc:
        console.print(f"[red]fleet up cannot start:[/] {exc}")
        raise typer.Exit(2) from None
    join_url = os.environ.get("NATS_URL") or None
    if size > 1 and join_url is not None:
        console.print(
            "[red]fleet up cannot start:[/] --cluster starts nodes of its own, and NATS_URL "
            "names a server to join: unset NATS_URL, or drop --cluster to join it "
            '(docs/deployment.md, "Joining a cluster")'
        )
        raise typer.Exit(2)
    ports: tuple[int, ...] = ()
    if size > 1:  # a block from --nats-port, or free ports one by one
        ports = nodes.block(nats_port, size) if nats_port else tuple(
            free_port() for _ in range(nodes.PORTS_PER_NODE * size)
        )  # fmt: skip
    data_dir = data_dir.resolve()
    options = UpOptions(
        data_dir=data_dir,
        gateway_port=port,
        nats_port=(ports[0] if ports else nats_port) or free_port(),
        join_url=join_url,
        grace_s=grace,
        cluster_ports=ports,
    )
    try:
        preflight(options)
    except CannotStart as exc:
        console.print(f"[red]fleet up cannot start:[/] {exc}")
        raise typer.Exit(2) from None
    llm_options = LlmOptions(
        mode=llm, data_dir=data_dir, port=llm_port or free_port(), cache=Cache(default_cache())
    )
    # The services' key pair before anything starts: the bootstrap seals FLEET_LLM_API_KEY with
    # it, the agent opens sealed keys with it (an operator's FLEET_SECRETS_* wins).
    os.environ.update(secrets_env(data_dir, os.environ))
    _logging(data_dir / "logs" / "fleet-up.log")
    try:
        asyncio.run(_up(options, llm_options, ready_timeout))
    except CannotStart as exc:  # found only once starting (NATS would not come up)
        console.print(f"[red]fleet up could not start:[/] {exc}")
        raise typer.Exit(1) from None
    except LocalLlmError as exc:  # the local model could not be installed or started
        console.print(f"[red]fleet up stopped:[/] {exc}")
        raise typer.Exit(2) from None


def _started(options: "UpOptions", started: "asyncio.Event") -> None:
    """The services run: remember this mesh for commands typed elsewhere or after a stop."""
    from fleet_cli.localmesh import remember_mesh

    try:
        remember_mesh(options.data_dir, options.gateway_url)
    except OSError as exc:  # a read-only home costs only the reminder, never the mesh
        log.warning("could not remember this mesh for later commands: %s", exc)
    started.set()


async def _up(options: "UpOptions", llm: "LlmOptions", ready_timeout: float) -> None:
    import asyncio
    import signal

    from fleet_cli import display
    from fleet_cli.children import ChildView
    from fleet_cli.localllm.up import hook
    from fleet_cli.mesh import up

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def show(views: list[ChildView]) -> None:
        console.print(display.processes(views))

    started = asyncio.Event()
    model = hook(llm, lambda line: log.info("%s", line), stop)
    mesh = asyncio.create_task(
        up(
            options,
            stop,
            on_change=show,
            on_started=lambda _: _started(options, started),
            before_services=model,
        )
    )
    announcer = asyncio.create_task(_announce(options, started, stop, ready_timeout))
    try:
        await mesh
    finally:
        announcer.cancel()  # a stop during the wait for /ready must not wait for it
        if model.background is not None:  # an install still running beside the mesh
            model.background.cancel()
    console.print("fleet stopped")


async def _announce(
    options: "UpOptions", started: "asyncio.Event", stop: "asyncio.Event", ready_timeout: float
) -> None:
    """Once the processes are up, wait for /ready and print the URL (or why it is not)."""
    from rich.markup import escape

    from fleet_cli import display
    from fleet_cli.localmesh import admin_token
    from fleet_cli.mesh import gateway_dir
    from fleet_cli.status import ask, wait_ready
    from fleet_mesh.tokens import dev_token

    await started.wait()
    answer = await wait_ready(options.gateway_url, ready_timeout)
    if stop.is_set():
        return
    token = admin_token(options.data_dir)
    if token is not None and answer.status_code is not None:  # the detail, for the table
        detailed = await ask(options.gateway_url, token=token)
        answer = detailed if detailed.status_code is not None else answer
    console.print(display.components(answer))
    if answer.ready:
        console.print(f"[bold green]fleet is ready:[/] {options.gateway_url}")
        token = dev_token(gateway_dir(options.data_dir))
        # one line, never folded at the console's width: it is copied whole
        console.print(f"development token (tenant dev, admin, 30 days): {token}", soft_wrap=True)
        for line in display.starting(answer):
            console.print(f"[yellow]{escape(line)}[/]", soft_wrap=True)
    else:
        console.print(
            f"[yellow]not ready after {ready_timeout:.0f}s[/]; still supervising. "
            f"Logs: {options.logs}"
        )


@app.command("status")
def status_command(
    data_dir: DataDir = Path(".fleet"),
    url: Annotated[
        str | None, typer.Option(help="gateway URL (default: the running mesh's)")
    ] = None,
) -> None:
    """Ask the gateway's /ready and show every component; exit 0 only when all are up."""
    import asyncio

    from rich.markup import escape

    from fleet_cli import display
    from fleet_cli.localmesh import (
        admin_token,
        mesh_dir,
        no_mesh_message,
        recorded_cluster,
        recorded_gateway,
    )
    from fleet_cli.status import ask

    data_dir = mesh_dir(data_dir)
    # the mesh's own token only to the gateway its running `fleet up` recorded; with none
    # running and no --url, nothing is asked: a default port may be anyone's
    local = recorded_gateway(data_dir)
    target = url.rstrip("/") if url else local
    if target is None:
        console.print(f"[red]{no_mesh_message(data_dir)}[/]", soft_wrap=True)
        raise typer.Exit(2)
    token = admin_token(data_dir, local=local is not None and target == local)
    answer = asyncio.run(ask(target, token=token))
    if answer.status_code is None:
        console.print(
            f"[red]no gateway at {answer.url}[/] ({answer.error}). Is `fleet up` running?"
        )
        raise typer.Exit(2)
    console.print(display.components(answer))
    for line in display.starting(answer):
        console.print(f"[yellow]{escape(line)}[/]", soft_wrap=True)
    recorded = recorded_cluster(data_dir) if local is not None and target == local else []
    healthy = True
    if recorded:
        from fleet_cli.cluster import look

        view = asyncio.run(look(recorded))
        console.print(display.cluster_nodes(view))
        console.print(display.cluster_streams(view))
        healthy = view.meta_leader is not None and all(up for _, _, up in view.nodes)
    raise typer.Exit(0 if answer.ready and healthy else 1)


def cli(argv: "Sequence[str] | None" = None) -> typer.Typer:
    """The `fleet` app with the client commands `argv` needs (all of them when None)."""
    return register(app, argv)


def main() -> None:
    cli(sys.argv[1:])()
