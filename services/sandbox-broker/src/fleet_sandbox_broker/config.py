"""The broker's settings, read once from the environment (`FLEET_SANDBOX_*`, `RLM_CHILD_*`)."""

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_events.sandbox import Limits


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_SANDBOX_", frozen=True, extra="ignore")

    root: Path = Path("/var/lib/fleet-rlm/sandboxes")
    python: str = "/usr/bin/python3"
    uid_base: int = Field(default=310000, ge=1000)
    uid_count: int = Field(default=4096, ge=1)
    max_frame_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    output_cap_chars: int = Field(default=1024 * 1024, ge=1024)
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=1024 * 1024)
    memory_mb: int = Field(default=1024, ge=64)
    cpu_s_per_cell: int = Field(default=60, ge=1)
    cpu_s_total: int = Field(default=3600, ge=1)
    nproc: int = Field(default=64, ge=4)
    file_mb: int = Field(default=1024, ge=1)
    open_files: int = Field(default=256, ge=32)
    wall_s: float = Field(default=120.0, gt=0)
    callback_timeout_s: float = Field(default=600.0, gt=0)
    child_isolation_mode: Literal["auto", "context"] = Field(
        default="auto",
        validation_alias=AliasChoices("RLM_CHILD_ISOLATION_MODE", "FLEET_SANDBOX_CHILD_MODE"),
    )
    child_fork_fallback: Literal["clean", "none"] = Field(
        default="clean",
        validation_alias=AliasChoices("RLM_CHILD_FORK_FALLBACK", "FLEET_SANDBOX_FORK_FALLBACK"),
    )

    def default_limits(self) -> Limits:
        return Limits(
            memory_mb=self.memory_mb,
            cpu_s_per_cell=self.cpu_s_per_cell,
            cpu_s_total=self.cpu_s_total,
            nproc=self.nproc,
            file_mb=self.file_mb,
            open_files=self.open_files,
            wall_s=self.wall_s,
        )
