"""Seed files and the operator's command (fleet_mesh.credentials): modes, roles, what is
written where, and that no seed leaves its file."""

import stat
from pathlib import Path

import pytest

from fleet_events.access import ROLES
from fleet_mesh.credentials import CredentialsError, check_file, ensure_credentials, main


def test_seeds_are_private_kept_across_calls_and_named_by_their_role(tmp_path: Path) -> None:
    made = ensure_credentials(tmp_path / "c")
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700
    first = {r: made.seed_path(r).read_bytes() for r in ROLES}
    again = ensure_credentials(tmp_path / "c")
    assert {r: again.seed_path(r).read_bytes() for r in ROLES} == first
    assert len(set(first.values())) == len(ROLES)
    assert check_file(made.seed_path("agent")) == "agent"
    assert made.public_key("agent").startswith("U")


def test_a_readable_misnamed_or_garbled_seed_is_refused_naming_the_fix(tmp_path: Path) -> None:
    made = ensure_credentials(tmp_path / "c")
    path = made.seed_path("budget")
    path.chmod(0o644)
    with pytest.raises(CredentialsError, match="mode 644: other users could read them"):
        check_file(path)
    with pytest.raises(CredentialsError, match=r"its name must be <role>\.nk"):
        check_file(tmp_path / "c" / "rogue.nk")
    garbled = tmp_path / "c" / "quality.nk"
    garbled.write_bytes(b"SUnotaseed")
    with pytest.raises(CredentialsError, match="does not hold an NKey user seed"):
        check_file(garbled)
    with pytest.raises(CredentialsError, match="no such file"):
        check_file(tmp_path / "elsewhere" / "agent.nk")


def test_the_operators_command_writes_seeds_and_a_block_of_public_keys_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([str(tmp_path / "creds")])
    block = (tmp_path / "creds" / "authorization.conf").read_text()
    for role in ROLES:
        seed = (tmp_path / "creds" / f"{role}.nk").read_text().strip()
        assert seed.startswith("SU")
        assert seed not in block
        assert seed not in capsys.readouterr().out
    assert block.count('"nkey": "U') == len(ROLES)
