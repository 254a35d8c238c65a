"""Print the lock's inputs: every third-party requirement of the workspace, one per line.

Read from each member's pyproject (`libs/*`, `apps/*`, `services/*`) and the root's dev group, with
the workspace members themselves left out (they are installed editable, without deps), plus
the build backend the editable installs need. Stdlib only: it runs before any venv exists.

`--digest` prints a sha256 of that list instead; `scripts/lock` records it in the lock and
`scripts/test` compares it, so a dependency added to a pyproject without relocking fails loudly.
"""

import hashlib
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_TOOLS = ("hatchling", "editables")
WORKSPACE_PREFIX = "fleet-"


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    return match.group(0).lower().replace("_", "-") if match else requirement


def inputs() -> list[str]:
    found: set[str] = set(BUILD_TOOLS)
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found.update(root.get("dependency-groups", {}).get("dev", []))
    members = [
        p for group in ("libs", "apps", "services") for p in ROOT.glob(f"{group}/*/pyproject.toml")
    ]
    for pyproject in sorted(members):
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        found.update(project.get("dependencies", []))
    third_party = {req.strip() for req in found if not _name(req).startswith(WORKSPACE_PREFIX)}
    return sorted(third_party, key=lambda req: (_name(req), req))


def digest() -> str:
    return hashlib.sha256("\n".join(inputs()).encode()).hexdigest()


if __name__ == "__main__":
    if sys.argv[1:] == ["--digest"]:
        print(digest())
    else:
        print("\n".join(inputs()))
