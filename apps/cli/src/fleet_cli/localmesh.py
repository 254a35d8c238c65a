"""The mesh `fleet up` runs from a data dir, as this machine's files say: the gateway it
recorded (only while that `fleet up` lives) and its development token.

The development token (an admin's, 30 days) is minted here and nowhere else, from the secret the
gateway made in its data dir; callers send it only to the gateway that mesh recorded.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path

from fleet_cli.errors import ClientError
from fleet_cli.mesh import gateway_dir
from fleet_mesh.tokens import SECRET_FILE, dev_token

DEFAULT_GATEWAY = "http://127.0.0.1:8080"


def recorded_gateway(data_dir: Path) -> str | None:
    """The gateway URL a running `fleet up` recorded in `data_dir`; None when none runs: no
    `up.json`, or one left by a `fleet up` that was killed (its pid is gone, and whatever
    listens on that port now is not this mesh's gateway)."""
    state = data_dir / "up.json"
    if state.exists():
        try:
            recorded = json.loads(state.read_text())
            return None if _gone(recorded.get("pid")) else str(recorded["gateway"])
        except (ValueError, KeyError, AttributeError):
            pass
    return None


def _gone(pid: object) -> bool:
    """Whether the `fleet up` that wrote the state file has ended (a file with no pid, from
    before it was recorded, is taken at its word)."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a process of another user holds that pid now: not our fleet up
        return True
    return False


def gateway_url(data_dir: Path, explicit: str | None) -> str:
    """An explicit URL wins; else the one a running `fleet up` recorded; else the default."""
    if explicit:
        return explicit.rstrip("/")
    return recorded_gateway(data_dir) or DEFAULT_GATEWAY


def admin_token(
    data_dir: Path, *, local: bool = True, env: Mapping[str, str] | None = None
) -> str | None:
    """The token that shows `/ready`'s detail (an anonymous caller gets only the verdict):
    `FLEET_TOKEN`, else the development token of the mesh in `data_dir` when the gateway asked
    is that mesh's (`local`: a token of this machine's mesh is never sent to another), else
    none."""
    env = os.environ if env is None else env
    if env.get("FLEET_TOKEN"):
        return env["FLEET_TOKEN"]
    if not local:
        return None
    try:
        return mint_token(data_dir)
    except (ClientError, RuntimeError):  # no secret yet, or one half written: the verdict only
        return None


def mint_token(data_dir: Path, *, tenant: str = "dev", user: str = "dev") -> str:
    secret_dir = gateway_dir(data_dir)
    if not (secret_dir / SECRET_FILE).exists():
        raise ClientError(
            f"no gateway signing secret in {secret_dir}: start the mesh with `fleet up "
            f"--data-dir {data_dir}` first, or set FLEET_URL and FLEET_TOKEN for another mesh"
        )
    return dev_token(secret_dir, tenant=tenant, user=user)
