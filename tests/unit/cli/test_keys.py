"""`fleet up`'s signing keys: private files no other user can read, made once, each service
given its own and none given the checkpoint key."""

import stat
from pathlib import Path

from fleet_cli.keys import CHECKPOINTER, ensure_keys, key_path, keys_dir
from fleet_cli.mesh import UpOptions, service_specs
from fleet_events.signing import CHECKPOINT, SIGNING_KEY_ENV
from fleet_events.subjects import SERVICES
from fleet_mesh.checkpoints import KEYSET_ENV
from fleet_mesh.keyfiles import read_keyset, read_signer


def test_keys_are_private_made_once_and_published_as_a_key_set(tmp_path: Path) -> None:
    first = ensure_keys(tmp_path, ["agent", "budget"])
    assert stat.S_IMODE(keys_dir(tmp_path).stat().st_mode) == 0o700
    for owner in ("agent", "budget", CHECKPOINTER):
        assert stat.S_IMODE(key_path(tmp_path, owner).stat().st_mode) == 0o600
    again = ensure_keys(tmp_path, ["agent", "budget"])
    assert set(again.keys) == set(first.keys)  # never replaced: old exports keep verifying
    pinned = read_keyset(keys_dir(tmp_path) / "keyset.json")
    assert pinned.require_signatures is True
    assert sorted((k.owner, k.role) for k in pinned.keys.values()) == [
        ("agent", "append"), ("budget", "append"), (CHECKPOINTER, CHECKPOINT),
    ]  # fmt: skip
    assert "seed" not in (keys_dir(tmp_path) / "keyset.json").read_text()


def test_each_service_is_given_its_own_key_and_none_the_checkpoint_key(tmp_path: Path) -> None:
    specs = service_specs(UpOptions(tmp_path), "nats://127.0.0.1:1")
    given = {spec.name: read_signer(Path(spec.env[SIGNING_KEY_ENV])) for spec in specs}
    assert set(given) == set(SERVICES)
    assert {name: signer.owner for name, signer in given.items()} == {s: s for s in SERVICES}
    assert len({signer.key_id for signer in given.values()}) == len(SERVICES)
    checkpoint = read_signer(key_path(tmp_path, CHECKPOINTER))
    assert checkpoint.key_id not in {signer.key_id for signer in given.values()}
    assert all(Path(spec.env[KEYSET_ENV]).exists() for spec in specs)
