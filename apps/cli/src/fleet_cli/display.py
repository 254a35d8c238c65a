"""Rich tables: the supervised processes, and the gateway's view of every component."""

from rich.table import Table

from fleet_cli.children import ChildView, State
from fleet_cli.cluster import ClusterView
from fleet_cli.status import ReadyAnswer

_STYLE = {State.RUNNING: "green", State.WAITING: "yellow", State.STOPPED: "dim"}
_COMPONENT_STYLE = {"up": "green", "starting": "yellow", "degraded": "yellow"}


def processes(views: list[ChildView]) -> Table:
    table = Table(title="fleet processes", title_justify="left")
    for column in ("service", "state", "pid", "restarts", "last exit"):
        table.add_column(column)
    for view in views:
        table.add_row(
            view.name,
            f"[{_STYLE[view.state]}]{view.state.value}[/]",
            str(view.pid or "-"),
            str(view.restarts),
            "-" if view.last_exit is None else str(view.last_exit),
        )
    return table


def components(answer: ReadyAnswer) -> Table:
    verdict = "[green]ready[/]" if answer.ready else "[red]not ready[/]"
    table = Table(title=f"{answer.url}/ready: {verdict}", title_justify="left")
    for column in ("component", "kind", "state", "replica", "latency ms", "detail"):
        table.add_column(column)
    for item in (answer.body or {}).get("components", []):
        state = item.get("state", "?")
        latency = item.get("latency_ms")
        table.add_row(
            str(item.get("name")),
            str(item.get("kind")),
            f"[{_COMPONENT_STYLE.get(state, 'red')}]{state}[/]",
            str(item.get("replica") or "-"),
            "-" if latency is None else f"{latency:.1f}",
            str(item.get("detail") or ""),
        )
    return table


def starting(answer: ReadyAnswer) -> list[str]:
    """A line for each component on its way up (the embedded model installing): what it does
    and how long it still needs, and that the mesh serves meanwhile."""
    return [
        f"{item.get('name')}: {item.get('detail') or 'starting'}; the mesh serves meanwhile and "
        "model calls wait for it"
        for item in (answer.body or {}).get("components", [])
        if item.get("state") == "starting"
    ]


def cluster_nodes(view: ClusterView) -> Table:
    leader = view.meta_leader or "[red]none (no quorum)[/]"
    table = Table(title=f"nats cluster: meta leader {leader}", title_justify="left")
    for column in ("node", "url", "state", "role"):
        table.add_column(column)
    for name, url, answering in view.nodes:
        state = "[green]up[/]" if answering else "[red]down[/]"
        table.add_row(name, url, state, "meta leader" if name == view.meta_leader else "")
    return table


def cluster_streams(view: ClusterView) -> Table:
    table = Table(title="streams (each at its leader)", title_justify="left")
    for column in ("stream", "leader", "replicas", "lag (messages)"):
        table.add_column(column)
    for row in view.streams:
        replicas = ", ".join(
            f"{name}" + ("" if current else " [red](not current)[/]")
            for name, current, _ in row.replicas
        )
        lag = ", ".join(f"{name} {lag}" for name, _, lag in row.replicas)
        table.add_row(row.stream, row.leader, replicas or "[yellow]none[/]", lag or "-")
    return table
