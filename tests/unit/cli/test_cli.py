"""`fleet` argument handling that needs no running mesh."""

import json
import os
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from fleet_cli.main import cli
from fleet_mesh.natsserver import free_port

app = cli()  # every command, as `fleet --help` has them


def said(result: Result) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(result.output.split())


@pytest.mark.parametrize("llm", ["gpt big", "../etc", "x" * 65])
def test_up_refuses_an_llm_mode_that_is_neither_local_none_nor_a_profile_name(
    tmp_path: Path, llm: str
) -> None:
    result = CliRunner().invoke(app, ["up", "--llm", llm, "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "is neither local, none nor a profile name" in said(result)
    assert not (tmp_path / "logs").exists()  # refused before starting anything


def test_status_without_a_gateway_says_so_and_exits_2(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["status", "--data-dir", str(tmp_path), "--url", url])
    assert result.exit_code == 2
    assert f"no gateway at {url}" in said(result)


def test_up_refuses_a_gateway_port_that_is_taken_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        argv = ["up", "--data-dir", str(tmp_path), "--port", str(port), "--nats-port", "0"]
        result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert f"gateway port {port} on 127.0.0.1 is in use; pass --port" in said(result)
    assert not (tmp_path / "logs").exists()


def test_up_refuses_a_second_mesh_on_the_same_data_dir(tmp_path: Path) -> None:
    (tmp_path / "up.json").write_text(json.dumps({"pid": os.getpid(), "gateway": "x"}))
    result = CliRunner().invoke(app, ["up", "--data-dir", str(tmp_path), "--nats-port", "0"])
    assert result.exit_code == 2
    assert f"already running (fleet up, pid {os.getpid()})" in said(result)
