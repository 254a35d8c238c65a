"""The mesh `fleet up` runs from a data dir, as this machine's files say: the gateway it
recorded (only while that `fleet up` lives), its development token, and the last mesh this
user started (so a command run from another folder, or after a stop, can say where it was).

The development token (an admin's, 30 days) is minted here and nowhere else, from the secret the
gateway made in its data dir; callers send it only to the gateway that mesh recorded while it
runs. The remembered last mesh only finds a data dir and words messages ("no mesh runs (last
at ...)"): a token never goes to an address because it was remembered.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path

from fleet_cli.errors import ClientError
from fleet_cli.mesh import gateway_dir
from fleet_mesh.tokens import SECRET_FILE, dev_token

DEFAULT_DATA_DIR = Path(".fleet")
DATA_DIR_ENV = "FLEET_DATA_DIR"
LAST_MESH_FILE = "last-mesh.json"


def state_home(env: Mapping[str, str] | None = None) -> Path:
    """Where this user's CLI remembers things: `$XDG_STATE_HOME/fleet-rlm`, else
    `~/.local/state/fleet-rlm`."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local/state")
    return Path(base) / "fleet-rlm"


def remember_mesh(data_dir: Path, gateway: str, env: Mapping[str, str] | None = None) -> None:
    """Written by `fleet up` once its services run: the data dir and the gateway it serves."""
    home = state_home(env)
    home.mkdir(parents=True, exist_ok=True)
    scratch = home / f".{LAST_MESH_FILE}.{os.getpid()}"
    scratch.write_text(json.dumps({"data_dir": str(data_dir.resolve()), "gateway": gateway}))
    scratch.replace(home / LAST_MESH_FILE)


def last_mesh(env: Mapping[str, str] | None = None) -> tuple[Path, str] | None:
    """The data dir and gateway of the last mesh `fleet up` started for this user, running
    or not; None when none is remembered (or the file is unreadable)."""
    try:
        row = json.loads((state_home(env) / LAST_MESH_FILE).read_text())
        return Path(str(row["data_dir"])), str(row["gateway"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def mesh_dir(given: Path, env: Mapping[str, str] | None = None) -> Path:
    """The data dir a client command means: one named (`--data-dir`, `FLEET_DATA_DIR`) as
    given; the default `./.fleet` when a mesh runs from it; else the last mesh this user
    started when it still runs (a command typed in another folder finds it); else `./.fleet`."""
    env = os.environ if env is None else env
    if given != DEFAULT_DATA_DIR:
        return given.resolve()
    if env.get(DATA_DIR_ENV):
        return Path(env[DATA_DIR_ENV]).resolve()
    here = given.resolve()
    if recorded_gateway(here) is not None:
        return here
    last = last_mesh(env)
    if last is not None and recorded_gateway(last[0]) is not None:
        return last[0]
    return here


class NoMesh(ClientError):
    """No mesh runs where the command looked, and no address was given."""


def no_mesh_message(data_dir: Path, env: Mapping[str, str] | None = None) -> str:
    """Says that no mesh runs from `data_dir`, where the last one ran, and what to do."""
    last = last_mesh(env)
    where = f"no mesh runs from {data_dir}"
    if last is not None:
        state = "running" if recorded_gateway(last[0]) is not None else "stopped"
        where += f" (the last one fleet up started: gateway {last[1]}, data {last[0]}, {state})"
    return (
        f"{where}: start it with ./scripts/run or `fleet up --data-dir {data_dir}`, name "
        f"another data dir with --data-dir or {DATA_DIR_ENV}, or set FLEET_URL and FLEET_TOKEN "
        "for a mesh elsewhere"
    )


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


def recorded_cluster(data_dir: Path) -> list[dict[str, str]]:
    """The nodes (name, url, monitor) a running `fleet up --cluster N` recorded; [] for one
    node, a mesh joined to NATS_URL, or no running mesh."""
    if recorded_gateway(data_dir) is None:
        return []
    try:
        nodes = json.loads((data_dir / "up.json").read_text()).get("cluster") or []
        return [{k: str(n[k]) for k in ("name", "url", "monitor")} for n in nodes]
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return []


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
    """An explicit URL wins; else the one a running `fleet up` recorded. With neither, no
    address is guessed (a default port may be anyone's): `NoMesh`, saying so."""
    if explicit:
        return explicit.rstrip("/")
    recorded = recorded_gateway(data_dir)
    if recorded is None:
        raise NoMesh(no_mesh_message(data_dir))
    return recorded


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
