"""`fleet up --cluster N`'s pure parts: sizes, ports, the nodes' config, the status view."""

from pathlib import Path

import pytest

from fleet_cli import cluster
from fleet_cli.cluster import BadClusterSize, check_size, layout, view_of
from fleet_mesh.natsserver import NatsServer


def test_only_odd_sizes_up_to_five_are_taken_and_a_refusal_says_which_to_use() -> None:
    assert [check_size(n) for n in (1, 3, 5)] == [1, 3, 5]
    said = r"--cluster 2: 2 nodes need 2 for a quorum, so they survive 0 lost node\(s\), as 1"
    with pytest.raises(BadClusterSize, match=said):
        check_size(2)
    with pytest.raises(BadClusterSize, match=r"4 nodes need 3 for a quorum, so they survive 1"):
        check_size(4)
    with pytest.raises(BadClusterSize, match="at most 5 nodes on one machine"):
        check_size(7)
    with pytest.raises(BadClusterSize, match="at least 1 node"):
        check_size(0)
    assert [cluster.quorum(n) for n in (1, 3, 5)] == [1, 2, 3]


def test_a_port_block_lays_out_clients_then_routes_then_monitors(tmp_path: Path) -> None:
    ports = cluster.block(4222, 3)
    assert ports == tuple(range(4222, 4231))
    nodes = layout(tmp_path, ports)
    assert [(n.name, n.port, n.route_port, n.monitor_port) for n in nodes] == [
        ("nats-0", 4222, 4225, 4228),
        ("nats-1", 4223, 4226, 4229),
        ("nats-2", 4224, 4227, 4230),
    ]
    assert len({n.store_dir for n in nodes}) == 3  # a store of its own each
    assert (
        cluster.urls(nodes) == "nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224"
    )
    with pytest.raises(ValueError, match="3 per node"):
        layout(tmp_path, (1, 2, 3, 4))


def test_each_node_is_configured_with_its_name_routes_to_all_and_a_monitor(tmp_path: Path) -> None:
    nodes = layout(tmp_path, cluster.block(5000, 3))
    text = cluster.server_of(nodes[1], nodes, "always").config_text()
    assert 'listen: "127.0.0.1:5001"' in text
    assert 'server_name: "nats-1"' in text
    assert 'http: "127.0.0.1:5007"' in text
    assert 'name: "fleet-local"' in text
    assert 'listen: "127.0.0.1:5004"' in text  # its route port
    routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in (5003, 5004, 5005))
    assert f"routes: [{routes}]" in text
    assert "sync_interval: always" in text
    alone = NatsServer(store_dir=tmp_path, port=4222).config_text()
    assert "cluster" not in alone  # one node: as before
    assert "http:" not in alone


RECORDED = [
    {"name": f"nats-{i}", "url": f"nats://127.0.0.1:{4222 + i}", "monitor": f"http://x:{8222 + i}"}
    for i in range(3)
]


def jsz(leader: str, streams: dict[str, tuple[str, list[dict[str, object]]]]) -> dict[str, object]:
    """A node's `/jsz?accounts=true&streams=true`, the fields the view reads (as 2.15 writes)."""
    details = [
        {"name": name, "cluster": {"name": "fleet-local", "leader": at, "replicas": replicas}}
        for name, (at, replicas) in streams.items()
    ]
    return {
        "meta_cluster": {"name": "fleet-local", "leader": leader, "cluster_size": 3},
        "account_details": [{"name": "$G", "stream_detail": details}],
    }


def test_the_status_view_reads_each_stream_from_its_leaders_account() -> None:
    follower = [{"name": "nats-0", "current": True}]  # a follower lists the others, no lag
    at_leader = [
        {"name": "nats-1", "current": True, "lag": 0},
        {"name": "nats-2", "current": False, "lag": 17, "offline": True},
    ]
    answers = [
        jsz("nats-0", {"SESSIONS": ("nats-0", at_leader)}),
        jsz("nats-0", {"SESSIONS": ("nats-0", follower)}),
        None,  # nats-2 down
    ]
    view = view_of(RECORDED, answers)
    assert view.meta_leader == "nats-0"
    assert view.nodes == (
        ("nats-0", "nats://127.0.0.1:4222", True),
        ("nats-1", "nats://127.0.0.1:4223", True),
        ("nats-2", "nats://127.0.0.1:4224", False),
    )
    (row,) = view.streams
    assert (row.stream, row.leader) == ("SESSIONS", "nats-0")
    assert row.replicas == (("nats-1", True, 0), ("nats-2", False, 17))


def test_no_quorum_means_no_meta_leader_in_the_view() -> None:
    answers = [{"meta_cluster": {"name": "fleet-local"}}, None, None]
    view = view_of(RECORDED, answers)
    assert (view.meta_leader, view.streams) == (None, ())
