"""The broker's settings, read once from the environment (`FLEET_SANDBOX_*`).

The child isolation policy is not here: it is read from the config KV at each decision
(`rlm_child_isolation_mode`, `rlm_child_fork_fallback`; the environment only seeds them).
"""

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_events.sandbox import Limits
from fleet_sandbox_broker.providers.local import HIDE


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_SANDBOX_", frozen=True, extra="ignore")

    root: Path = Path("/var/lib/fleet-rlm/sandboxes")
    hide: tuple[str, ...] = HIDE  # FLEET_SANDBOX_HIDE='["/home", "/work"]' (JSON list)
    python: str = "/usr/bin/python3"
    uid_base: int = Field(default=310000, ge=1000)
    uid_count: int = Field(default=4096, ge=1)
    # flocks claiming uids, shared by every broker on the host (a tmpfs: claims die with it)
    uid_locks: Path = Path("/run/fleet-rlm/sandbox-uids")
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
    volumes: Path = Path("/var/lib/fleet-rlm/volumes")
    pool_size: int = Field(default=2, ge=0, le=64)
    allow_local_repos: bool = False  # tests clone local git repositories; production never
    snapshot_max_bytes: int = Field(default=256 * 1024, ge=1024)
    snapshot_file_bytes: int = Field(default=32 * 1024, ge=256)

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
