"""Which token `fleet status` and `fleet up` send to `/ready` (an anonymous caller gets only the
verdict; the detail needs an admin's token)."""

from pathlib import Path

import jwt
import pytest

from fleet_cli.mesh import gateway_dir
from fleet_cli.status import admin_token
from fleet_gateway.auth import signing_secret


@pytest.fixture(autouse=True)
def _own_gateway_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_GATEWAY_DATA_DIR", raising=False)


def test_an_explicit_token_wins_even_for_another_mesh(tmp_path: Path) -> None:
    env = {"FLEET_TOKEN": "given"}
    assert admin_token(tmp_path, env=env) == "given"
    assert admin_token(tmp_path, local=False, env=env) == "given"


def test_no_local_mesh_means_no_token(tmp_path: Path) -> None:
    assert admin_token(tmp_path, env={}) is None


def test_the_local_meshs_development_token_is_an_admins(tmp_path: Path) -> None:
    secret = signing_secret(gateway_dir(tmp_path))
    token = admin_token(tmp_path, env={})
    assert token is not None
    claims = jwt.decode(token, secret, algorithms=["HS256"], options={"verify_aud": False})
    assert claims["fleet_admin"] is True


def test_the_local_token_is_never_sent_to_another_gateway(tmp_path: Path) -> None:
    signing_secret(gateway_dir(tmp_path))
    assert admin_token(tmp_path, local=False, env={}) is None
