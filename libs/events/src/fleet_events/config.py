"""Runtime settings kept in the `fleet-config` KV bucket: what they are, what values they take.

Environment variables only *seed* the bucket at bootstrap (never overwriting a stored value);
from then on the bucket is the truth, per tenant with a global fallback, and every change is
kept in the bucket's history. Global keys are written only by an admin (the gateway enforces it).

A setting marked `operator_only` is the deployment's to choose (what it costs the operator, how
it runs), not a tenant's: its tenant value, too, is written by an admin only (the gateway's
admin route `PATCH /api/v1/runtime/settings/tenants/{tenant}`), never by the tenant itself. The
gateway is the only writer of the bucket, so the services reading it trust what is there.
"""

from dataclasses import dataclass

from fleet_events.ids import check_id


class InvalidSetting(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Setting:
    key: str
    env: str
    default: str
    choices: tuple[str, ...] = ()
    integer: bool = False
    description: str = ""
    operator_only: bool = False
    """Set by an admin only, globally or for a named tenant; a tenant cannot set its own."""

    def validate(self, value: str) -> str:
        if self.choices and value not in self.choices:
            raise InvalidSetting(
                f"{self.key} (env {self.env}) cannot be {value!r}: use one of "
                f"{', '.join(self.choices)}"
            )
        if self.integer and not (value.isdigit() and len(value) <= 9):
            raise InvalidSetting(
                f"{self.key} (env {self.env}) must be a non-negative integer, got {value!r}"
            )
        return value


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "rlm_child_isolation_mode",
        "RLM_CHILD_ISOLATION_MODE",
        "auto",
        choices=("auto", "context"),
        description="how a recursive child gets its sandbox: auto (fork or clean) or context",
    ),
    Setting(
        "rlm_child_fork_fallback",
        "RLM_CHILD_FORK_FALLBACK",
        "clean",
        choices=("clean", "none"),
        description="when forking a child fails: retry with a clean sandbox, or fail",
    ),
    Setting(
        "sandbox_warm_pool_size",
        "FLEET_SANDBOX_WARM_POOL_SIZE",
        "2",
        integer=True,
        description="started clean sandboxes kept ready per broker replica",
        operator_only=True,
    ),
    Setting(
        "rlm_max_llm_calls",
        "RLM_MAX_LLM_CALLS",
        "50",
        integer=True,
        description="LLM calls a whole recursive tree may make",
    ),
    Setting("rlm_max_depth", "RLM_MAX_DEPTH", "3", integer=True, description="deepest child run"),
    Setting(
        "rlm_max_tree_calls",
        "RLM_MAX_TREE_CALLS",
        "500",
        integer=True,
        description="every model call of a turn's tree: each run's steps, sub calls and child "
        "runs' calls (rlm_max_llm_calls counts sub calls only)",
    ),
    Setting(
        "rlm_max_child_runs",
        "RLM_MAX_CHILD_RUNS",
        "100",
        integer=True,
        description="child runs (sub_rlm) a turn's tree may start, at every depth",
    ),
    Setting(
        "sandbox_provider",
        "FLEET_SANDBOX_PROVIDER",
        "local",
        choices=("local", "daytona"),
        description="where a tenant's new sandboxes run: local processes, or Daytona (the "
        "broker needs DAYTONA_API_KEY, DAYTONA_API_URL and DAYTONA_TARGET for daytona); an "
        "admin's choice, per tenant or globally: Daytona runs on the operator's account",
        operator_only=True,
    ),
)

BY_KEY = {setting.key: setting for setting in SETTINGS}


def setting(key: str) -> Setting:
    try:
        return BY_KEY[key]
    except KeyError:
        raise InvalidSetting(
            f"unknown setting {key!r}: known settings are {', '.join(sorted(BY_KEY))}"
        ) from None


def global_key(key: str) -> str:
    return f"global.{setting(key).key}"


def tenant_key(tenant: str, key: str) -> str:
    return f"tenant.{check_id('tenant', tenant)}.{setting(key).key}"
