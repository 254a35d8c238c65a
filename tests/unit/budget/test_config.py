import pytest
from pydantic import ValidationError

from fleet_budget.config import BudgetSettings
from fleet_budget.domain import TenantCaps


def test_tenant_caps_come_from_json_env_with_a_default_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEET_BUDGET_TENANT_CAPS", '{"acme": {"calls_per_day": 5000}}')
    monkeypatch.setenv("FLEET_BUDGET_DEFAULT_TENANT_CAPS", '{"cost_per_day": 2.5}')
    settings = BudgetSettings()
    assert settings.caps_for("acme") == TenantCaps(calls_per_day=5000)
    assert settings.caps_for("other") == TenantCaps(cost_per_day=2.5)
    monkeypatch.delenv("FLEET_BUDGET_DEFAULT_TENANT_CAPS")
    assert not BudgetSettings().caps_for("other").any  # no caps unless configured


def test_a_negative_cap_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_BUDGET_TENANT_CAPS", '{"acme": {"calls_per_day": -1}}')
    with pytest.raises(ValidationError, match="calls_per_day"):
        BudgetSettings()
