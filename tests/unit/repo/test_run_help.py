"""`./scripts/run --help` answers at once on a machine with no venv yet: it prints
scripts/run.help, which must say what `fleet up --help` says today. Regenerate it with
`FLEET_REGENERATE_HELP=1 .venv/bin/python -m pytest tests/unit/repo/test_run_help.py`.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HELP_FILE = ROOT / "scripts" / "run.help"


def current_help() -> str:
    """`fleet up --help` as a plain terminal 100 columns wide shows it."""
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("FORCE_COLOR", None)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "fleet"), "up", "--help"],
        capture_output=True, text=True, env=env, check=True, timeout=60,
    )  # fmt: skip
    return "".join(line.rstrip() + "\n" for line in done.stdout.strip("\n").splitlines())


def test_the_stored_help_is_what_fleet_up_says() -> None:
    fresh = current_help()
    if os.environ.get("FLEET_REGENERATE_HELP"):
        HELP_FILE.write_text(fresh)
    assert "--data-dir" in fresh, "fleet up --help printed no options: the check reads nothing"
    assert HELP_FILE.read_text() == fresh, (
        "scripts/run.help is stale: regenerate it with FLEET_REGENERATE_HELP=1 "
        ".venv/bin/python -m pytest tests/unit/repo/test_run_help.py"
    )


def test_run_help_answers_without_a_venv(tmp_path: Path) -> None:
    """A checkout whose .venv is missing: --help prints the stored help and installs nothing."""
    for name in ("run", "run.help", "setup-venv", "lock_inputs.py"):
        (tmp_path / "scripts").mkdir(exist_ok=True)
        (tmp_path / "scripts" / name).write_bytes((ROOT / "scripts" / name).read_bytes())
        (tmp_path / "scripts" / name).chmod(0o755)
    (tmp_path / "requirements.lock").write_bytes((ROOT / "requirements.lock").read_bytes())
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    done = subprocess.run(
        [str(tmp_path / "scripts" / "run"), "--help"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(HELP_FILE.read_text()), done.stdout[:300]
    assert ".venv is not set up yet" in done.stdout
    assert not (tmp_path / ".venv").exists()
    assert not (tmp_path / ".fleet").exists()
