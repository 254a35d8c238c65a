"""`fleet up` gives the broker the same replica name on every start from one data dir (issue 8:
a fresh name each start left the dead broker's sandboxes to nobody)."""

from pathlib import Path

import pytest

from fleet_cli.identity import REPLICAS_FILE, replica_name
from fleet_cli.mesh import CannotStart, UpOptions, preflight, service_specs


def env_of(data_dir: Path, service: str) -> dict[str, str]:
    (spec,) = [s for s in service_specs(UpOptions(data_dir), "nats://x:1") if s.name == service]
    return spec.env


def test_the_broker_keeps_its_replica_name_across_starts_of_one_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_REPLICA", "inherited-from-the-shell")
    first = env_of(tmp_path / "a", "sandbox-broker")["FLEET_REPLICA"]
    assert first.startswith("sandbox-broker-")
    assert env_of(tmp_path / "a", "sandbox-broker")["FLEET_REPLICA"] == first
    assert env_of(tmp_path / "b", "sandbox-broker")["FLEET_REPLICA"] != first
    # services that hold no state keep getting a fresh name, never the shell's
    assert "FLEET_REPLICA" not in env_of(tmp_path / "a", "agent")


def test_an_unreadable_replicas_file_stops_fleet_up_before_anything_starts(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / REPLICAS_FILE).write_text('{"sandbox-broker": "has spaces and dots."}')
    with pytest.raises(CannotStart, match=r"replicas\.json must map service names"):
        preflight(UpOptions(tmp_path, gateway_port=1, nats_port=1))
    (tmp_path / REPLICAS_FILE).write_text("{not json")
    with pytest.raises(CannotStart, match="is unreadable"):
        preflight(UpOptions(tmp_path, gateway_port=1, nats_port=1))


def test_a_name_given_once_is_kept_when_others_are_added(tmp_path: Path) -> None:
    broker = replica_name(tmp_path, "sandbox-broker")
    replica_name(tmp_path, "budget")
    assert replica_name(tmp_path, "sandbox-broker") == broker
