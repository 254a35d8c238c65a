"""Where the local LLM's pieces live. The weights and the built wheel are per machine (one
cache serves every checkout, every data dir and every fresh test venv); the API key belongs to
one mesh, so it lives in that mesh's data dir."""

import os
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "FLEET_LLM_CACHE"


def default_cache() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleet-rlm"


@dataclass(frozen=True)
class Cache:
    root: Path

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def wheels(self) -> Path:
        return self.root / "wheels"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def lock_file(self) -> Path:
        return self.root / "install.lock"

    def make(self) -> None:
        for folder in (self.models, self.wheels, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
