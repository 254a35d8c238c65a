"""Every branch of the child isolation policy (RLM_CHILD_ISOLATION_MODE / _FORK_FALLBACK)."""

import pytest

from fleet_sandbox_broker.domain import ChildPolicy, ParentFacts, after_fork_failure, decide_child

NO_VOLUME = ParentFacts(has_volume=False, provider_can_fork=True)
VOLUME = ParentFacts(has_volume=True, provider_can_fork=True)


def test_auto_without_a_volume_forks() -> None:
    assert decide_child(ChildPolicy(), NO_VOLUME).branch == "fork"


def test_auto_with_a_volume_gets_a_clean_child() -> None:
    plan = decide_child(ChildPolicy(), VOLUME)
    assert plan.branch == "clean_volume"
    assert "volume subpath" in plan.reason


@pytest.mark.parametrize(("fallback", "branch"), [("clean", "clean_fallback"), ("none", "refused")])
def test_a_failed_fork_falls_back_or_is_refused(fallback: str, branch: str) -> None:
    plan = after_fork_failure(ChildPolicy(fallback=fallback), "no quiet point")  # type: ignore[arg-type]
    assert plan.branch == branch
    assert "no quiet point" in plan.reason


def test_a_provider_that_cannot_fork_goes_straight_to_the_fallback() -> None:
    facts = ParentFacts(has_volume=False, provider_can_fork=False)
    assert decide_child(ChildPolicy(), facts).branch == "clean_fallback"
    assert decide_child(ChildPolicy(fallback="none"), facts).branch == "refused"


def test_context_mode_reuses_the_parents_sandbox() -> None:
    for facts in (NO_VOLUME, VOLUME):
        assert decide_child(ChildPolicy(mode="context"), facts).branch == "context"
