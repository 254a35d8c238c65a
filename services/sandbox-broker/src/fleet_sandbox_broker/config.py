"""The broker's settings, read once from the environment (`FLEET_SANDBOX_*`).

The child isolation policy is not here: it is read from the config KV at each decision
(`rlm_child_isolation_mode`, `rlm_child_fork_fallback`; the environment only seeds them).
"""

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_events.sandbox import Limits
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.providers.launch import HIDE, SHOW

MIB = 1024 * 1024

# What a request may ask for, per field of `Limits` (inclusive). A negative or zero limit
# would lift the rlimit it stands for (`memory_mb=-1` is RLIM_INFINITY), so every field has a
# floor as well as a ceiling. FLEET_SANDBOX_LIMIT_BOUNDS='{"memory_mb": [64, 32768], ...}'.
LIMIT_BOUNDS: dict[str, tuple[float, float]] = {
    "memory_mb": (64, 16384),
    "cpu_s_per_cell": (1, 3600),
    "cpu_s_total": (1, 86400),
    "nproc": (4, 1024),
    "file_mb": (1, 65536),
    "open_files": (32, 65536),
    "wall_s": (0.1, 86400),
}


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_SANDBOX_", frozen=True, extra="ignore")

    root: Path = Path("/var/lib/fleet-rlm/sandboxes")
    # host paths a sandbox sees (an allow-list), and paths under them covered anyway
    show: tuple[str, ...] = SHOW  # FLEET_SANDBOX_SHOW='["/usr", "/bin"]' (JSON list)
    hide: tuple[str, ...] = HIDE  # FLEET_SANDBOX_HIDE='["/usr/local/secret"]' (JSON list)
    max_tool_calls: int = Field(default=8, ge=1, le=256)  # host tool calls in flight per sandbox
    # members of one fork family (local provider): a fork-ready sandbox's process limit is
    # sized for this many (docs/sandboxes.md, "Fork families"); 1 keeps `nproc` exact and
    # makes every child a clean fallback
    family_max: int = Field(default=96, ge=1, le=1024)
    max_inodes: int = Field(default=100_000, ge=100)  # files and directories per sandbox
    # every local sandbox process on the host in one pids cgroup (`providers.tasks`): its
    # pids.max bounds them together (0: half the kernel's pid_max); "" turns it off
    task_cgroup: str = Field(default="fleet-rlm-sandboxes", pattern=r"^[A-Za-z0-9_.-]{0,64}$")
    host_tasks: int = Field(default=0, ge=0)
    # tasks all of one tenant's sandboxes may hold together (0: a quarter of the host bound)
    tenant_tasks: int = Field(default=0, ge=0)
    # each fork family's disk: a loop-mounted ext4 image of this many MiB, `max_inodes` inodes
    # (`providers.disks`; 0 turns it off), looked at every `disk_check_s`
    family_disk_mb: int = Field(default=4096, ge=0, le=1024 * 1024)
    disk_check_s: float = Field(default=2.0, gt=0)
    inode_check_s: float = Field(default=1.0, gt=0)
    python: str = "/usr/bin/python3"
    uid_base: int = Field(default=310000, ge=1000)
    uid_count: int = Field(default=4096, ge=1)
    # flocks claiming uids, shared by every broker on the host (a tmpfs: claims die with it)
    uid_locks: Path = Path("/run/fleet-rlm/sandbox-uids")
    max_frame_bytes: int = Field(default=4 * MIB, ge=64 * 1024)
    output_cap_chars: int = Field(default=MIB, ge=1024)
    # 1 MiB, as every other service and docs/architecture.md: the size of a default NATS
    # server's max_payload, so a request that passes here passes any server; larger inputs go
    # through the object store (variables, files, context files all can).
    max_request_bytes: int = Field(default=MIB, ge=64 * 1024)
    # every reply fits in this and in the server's max_payload, whichever is smaller; a file
    # read past it says to use via_blob, execution output past it is cut and says so
    max_reply_bytes: int = Field(default=MIB, ge=64 * 1024)
    # answers remembered for retries, by encoded size (not count: one `list` page or one
    # execution can be a megabyte)
    reply_cache_bytes: int = Field(default=64 * MIB, ge=MIB)
    # live (not deleted) sandboxes one tenant may hold, across replicas (a uid each): room for
    # a few turns' recursive trees at once (depth 3, fan-out 4 holds up to 85), while 32
    # tenants at their quota still fit in the default 4096 uids
    tenant_quota: int = Field(default=128, ge=1)
    list_page_max: int = Field(default=500, ge=1)
    limit_bounds: dict[str, tuple[float, float]] = Field(default_factory=lambda: dict(LIMIT_BOUNDS))
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
    # Which provider a tenant's sandboxes run on is the `sandbox_provider` setting in the config
    # KV (tenant over global; `fleet up` seeds the global value from this same env var), and
    # this when the KV holds neither. It is also the warm pool's provider, and `daytona` insists
    # Daytona is configured. The Daytona provider is built when DAYTONA_API_KEY,
    # DAYTONA_API_URL and DAYTONA_TARGET are all set (the SDK is imported only then, from these
    # settings: it would read `.env` itself); `local` unless FLEET_SANDBOX_LOCAL=false (a
    # Daytona-only broker needs no root, uid pool or sandbox root on its host).
    provider: Literal["local", "daytona"] = "local"
    local: bool = True
    daytona_api_key: SecretStr | None = Field(default=None, validation_alias="DAYTONA_API_KEY")
    daytona_api_url: str = Field(default="", validation_alias="DAYTONA_API_URL")
    daytona_target: str = Field(default="", validation_alias="DAYTONA_TARGET")
    daytona_snapshot: str | None = None  # a linux-vm snapshot: what makes fork possible
    daytona_snapshot_is_vm: bool = True
    # from an image instead: each sandbox's cpu/memory/disk then follow its Limits
    daytona_image: str | None = None
    daytona_cpu: int = Field(default=1, ge=1, le=64)
    daytona_disk_gb: int = Field(default=3, ge=1, le=1024)
    daytona_network_block_all: bool = True
    daytona_deadline_s: float = Field(default=60.0, gt=0)
    # how long an open circuit fails calls fast before one is let through again
    daytona_circuit_cool_s: float = Field(default=30.0, gt=0)
    # a refused create (the tenant's provider is not configured here) is answered every time
    # and recorded as sandbox.create_refused at most once per this many seconds per tenant
    refusal_record_s: float = Field(default=60.0, ge=0)

    @model_validator(mode="after")
    def _defaults_within_bounds(self) -> Self:
        """A default outside the bounds would refuse every create that omits `limits`."""
        missing = set(LIMIT_BOUNDS) - set(self.limit_bounds)
        if missing:
            raise ValueError(f"FLEET_SANDBOX_LIMIT_BOUNDS lacks {sorted(missing)}")
        problem = domain.limits_problem(self.default_limits(), self.limit_bounds)
        if problem is not None:
            raise ValueError(f"the default limits are out of bounds: {problem}")
        return self

    @model_validator(mode="after")
    def _daytona_configured(self) -> Self:
        if self.provider == "local" and not self.local:
            raise ValueError(
                "FLEET_SANDBOX_LOCAL=false leaves no local provider: set FLEET_SANDBOX_PROVIDER="
                "daytona (with Daytona configured) or enable the local provider"
            )
        if self.provider == "daytona" and not self.daytona_configured:
            raise ValueError(
                "FLEET_SANDBOX_PROVIDER=daytona needs DAYTONA_API_KEY, DAYTONA_API_URL and "
                "DAYTONA_TARGET; set all three, or use the default local provider"
            )
        return self

    @property
    def daytona_configured(self) -> bool:
        return bool(self.daytona_api_key and self.daytona_api_url and self.daytona_target)

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
