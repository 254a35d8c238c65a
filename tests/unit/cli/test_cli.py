"""`fleet` argument handling that needs no running mesh."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet_cli.main import app
from fleet_mesh.natsserver import free_port


@pytest.mark.parametrize(
    ("llm", "says"), [("local", "local-LLM issue"), ("gpt-big", "LLM-profiles issue")]
)
def test_up_refuses_llm_modes_that_do_not_exist_yet_and_says_which_issue_brings_them(
    tmp_path: Path, llm: str, says: str
) -> None:
    result = CliRunner().invoke(app, ["up", "--llm", llm, "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert f"--llm {llm} is not available yet" in result.output
    assert says in result.output
    assert not (tmp_path / "logs").exists()  # refused before starting anything


def test_status_without_a_gateway_says_so_and_exits_2(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["status", "--data-dir", str(tmp_path), "--url", url])
    assert result.exit_code == 2
    assert f"no gateway at {url}" in result.output
