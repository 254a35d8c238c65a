"""What the budgeted LM raises: members of the agent's failure family (`run.failures`) that are
also dspy model errors.

dspy passes its own `LMError` family through by identity and wraps anything else as an
"unexpected" engine bug; these are expected outcomes with messages meant for the model or the
operator, so they join that family too. Each states the turn's failure it ends (its code, its
flag, the user's message), which the run kernel's classifier finds anywhere in the cause chain.
"""

from dspy.utils.exceptions import LMConfigurationError, LMError

from fleet_agent.llm_failures import CallSite, LlmFailure
from fleet_agent.run.failures import (
    BUDGET_SPENT,
    NOT_CONFIGURED,
    RunCancelledError,
    RunFailure,
    not_configured_message,
)
from fleet_agent.runners import Failed
from fleet_events.llm import LlmProfile

# dspy is untyped: its error classes are `Any` to the type checker, hence the ignores below.


class BudgetSpent(RunFailure, LMError):  # type: ignore[misc]
    """The budget service refused the call; the message starts with "budget spent: ", which
    the model can read and act on. The turn it ends says what refused and what to change (the
    budget's own message names the cap and never a secret)."""

    default_code = BUDGET_SPENT

    def __init__(self, message: str) -> None:
        super().__init__(message, code=BUDGET_SPENT)

    @property
    def user_message(self) -> str:
        return (
            f"the budget refused this turn's model call: {str(self)[:500]}. A tenant's daily "
            "cap starts again at 00:00 UTC; a turn's own limits are the rlm_max_tree_calls, "
            "rlm_max_llm_calls, rlm_max_child_runs and rlm_max_depth settings"
        )


class LmCallFailed(RunFailure, LMError):  # type: ignore[misc]
    """The model call failed. With `failure` (a provider's answer, or none), the message starts
    with its code and says what to do, then what the provider said with any key scrubbed out:
    code reading it in a cell (`llm_query`) or ReAct's observation can tell a refused key
    from a rate limit. `retry_in_s`: the LM asks again after this wait (0: it does not).
    Without `failure` it states nothing (the run broke)."""

    default_code = "provider"

    def __init__(
        self, message: str, failure: LlmFailure | None = None, retry_in_s: float = 0.0
    ) -> None:
        shown = message
        if failure is not None:
            shown = f"{failure.code}: {failure.message}"
            shown += f" (the provider said: {message})" if message else ""
        super().__init__(shown, code=failure.code if failure else "provider")
        self.failure = failure
        self.retry_in_s = retry_in_s

    @property
    def user_message(self) -> str:
        return self.failure.message if self.failure is not None else str(self)

    def stated(self) -> Failed | None:
        return None if self.failure is None else super().stated()


class LmWaitCancelled(RunCancelledError, LMError):  # type: ignore[misc]
    """The run was cancelled while its model call waited (for the embedded model): a cancel,
    passed through dspy as one of its own errors (anything else it would wrap)."""


class LmNotConfigured(RunFailure, LMConfigurationError):  # type: ignore[misc]
    """The role has no usable profile or key; the message says what to set, and the turn's
    the ways to configure a model."""

    default_code = NOT_CONFIGURED

    def __init__(self, message: str) -> None:
        super().__init__(message, code=NOT_CONFIGURED)

    @property
    def user_message(self) -> str:
        return not_configured_message(str(self))


def call_site(profile: LlmProfile, role: str) -> CallSite:
    """What a failure's message may name of the call: the profile, never its key."""
    return CallSite(
        profile=profile.name, model=profile.model, role=role, secret=profile.secret,
        api_base=profile.api_base, timeout_s=profile.timeout_s,
    )  # fmt: skip


def retry_hook(exc: Exception) -> bool | float:
    """stamina's hook: only what the LM's attempt decided to ask again, after the wait it chose."""
    if isinstance(exc, LmCallFailed) and exc.retry_in_s > 0:
        return exc.retry_in_s
    return False


__all__ = ["BudgetSpent", "LMError", "LmCallFailed", "LmNotConfigured", "call_site", "retry_hook"]
