"""Repository rules CI can check without a network: the lock, the README, no registry host."""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# sha256 prefixes of the package registries' host names: the rule is that no tracked file
# names them, so neither does this test.
REGISTRY_HOSTS = {
    "a4aa2ac280bb8d1a",
    "c899567ee9068517",
    "9495278a74715c7e",
    "0dc11026ac75c015",
    "70bb4000cd2fab03",
}
HOST = re.compile(rb"[a-z0-9][a-z0-9.-]*\.(?:org|com|io|dev)\b", re.IGNORECASE)


def tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.fail("the hygiene checks read `git ls-files`: run them in a git checkout")
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_no_tracked_file_names_a_package_registry_host() -> None:
    offenders = []
    for path in tracked_files():
        if not path.is_file():
            continue
        for token in set(HOST.findall(path.read_bytes())):
            if hashlib.sha256(token.lower()).hexdigest()[:16] in REGISTRY_HOSTS:
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_the_lock_is_fresh_and_carries_no_address() -> None:
    digest = subprocess.run(
        [sys.executable, "scripts/lock_inputs.py", "--digest"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    lock = (ROOT / "requirements.lock").read_text()
    assert f"# inputs-digest: {digest}\n" in lock, "run ./scripts/lock"
    assert not re.search(r"[a-z+]+://|index-url|find-links", lock)
    pins = re.findall(r"^([a-z0-9._-]+)==\S+", lock, re.MULTILINE)
    assert pins
    assert not [name for name in pins if name.startswith("fleet-")]
    assert "torch" not in pins


def test_readme_starts_with_exactly_the_run_and_test_commands() -> None:
    first_block = (ROOT / "README.md").read_text().split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:]]
    assert [c for c in commands if c] == ["./scripts/run", "./scripts/test"]
    for script in ("scripts/run", "scripts/test", ".ci/run"):
        assert os.access(ROOT / script, os.X_OK), script
    assert "./scripts/test" in (ROOT / ".ci/run").read_text()
