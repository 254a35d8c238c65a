"""Replica names that survive a restart, kept in the data dir.

A sandbox broker's sandboxes are recorded in the log under its replica name, and after a
restart a broker revives or reaps exactly those of its own name. Started with a fresh name each
time, a restarted local mesh adopted none of them: their workspaces stayed on disk under their
old uids, and the uid pool handed those uids to other tenants' new sandboxes (issue 8). So
`fleet up` names each replica that holds state once, in `<data dir>/replicas.json`, and passes
the same name (`FLEET_REPLICA`) on every start from that data dir.
"""

import json
import os
import re
import uuid
from pathlib import Path

REPLICAS_FILE = "replicas.json"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class BadReplicas(Exception):
    """The data dir's replica names are unreadable; the message says what to do."""


def replica_name(data_dir: Path, service: str) -> str:
    """The name `service` runs under from this data dir, made (and kept) on first use."""
    path = data_dir / REPLICAS_FILE
    names = _read(path)
    name = names.get(service)
    if name is None:
        name = f"{service}-{uuid.uuid4().hex[:8]}"
        _write(path, {**names, service: name})
    return name


def _read(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        names = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadReplicas(f"{path} is unreadable ({exc}); restore it, or remove it to start "
                          "with new replica names (a dead broker's sandboxes are then reaped "
                          "by the next one)") from exc  # fmt: skip
    if not isinstance(names, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and _NAME.fullmatch(v) for k, v in names.items()
    ):
        raise BadReplicas(
            f"{path} must map service names to replica names ([A-Za-z0-9_-]{{1,64}}); "
            "restore it, or remove it to start with new replica names"
        )
    return names


def _write(path: Path, names: dict[str, str]) -> None:
    """Atomically: a crash mid-write must not lose the names already given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(names, indent=2, sort_keys=True) + "\n")
    os.replace(partial, path)
