"""The budget service's settings, read once from `FLEET_BUDGET_*` environment variables."""

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_budget.domain import TenantCaps


class TenantCapsSetting(BaseModel, frozen=True):
    calls_per_day: int | None = Field(default=None, ge=0)
    cost_per_day: float | None = Field(default=None, ge=0)


class BudgetSettings(BaseSettings):
    """`FLEET_BUDGET_TENANT_CAPS='{"acme": {"calls_per_day": 5000, "cost_per_day": 20}}'`."""

    model_config = SettingsConfigDict(env_prefix="FLEET_BUDGET_", frozen=True)

    concurrency: int = Field(default=64, ge=1, le=4096)
    """Requests of one verb a replica handles at once (those on one tree take turns)."""
    conflict_attempts: int = Field(default=64, ge=1)
    """Lost races one commit may absorb; `conflict_deadline_s` is the bound that usually ends it."""
    conflict_deadline_s: float = Field(default=1.5, gt=0)
    """Bounded below the client's attempt timeout, so a reply always comes before the retry."""
    cached_ledgers: int = Field(default=10_000, ge=1)
    tenant_caps: dict[str, TenantCapsSetting] = {}
    default_tenant_caps: TenantCapsSetting = TenantCapsSetting()

    def caps_for(self, tenant: str) -> TenantCaps:
        chosen = self.tenant_caps.get(tenant, self.default_tenant_caps)
        return TenantCaps(calls_per_day=chosen.calls_per_day, cost_per_day=chosen.cost_per_day)
