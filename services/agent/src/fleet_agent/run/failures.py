"""The agent's one failure family and its one classifier. No I/O; dspy only where a record
names one of its errors (`why`).

Every exception the agent raises on purpose is an `AgentError`, in one of four branches:

- `RunFailure`: the run cannot go on, for a reason that is safe to state and that the user can
  act on (the model refused the key, the budget refused the call, the repository could not be
  cloned). Its `code` is one of `TURN_FAILURES`, its message is the user's;
- `RunBroke`: the run cannot go on, and what happened is not for the user to read (it may hold
  anything): the turn says which type broke and where the details are;
- `RunSignal`: not a failure: the run unwinds (it was cancelled, fenced by a newer holder, or
  climbs from ReAct to the RLM), and its caller knows what to record;
- `InputError`: what a tool or a setting refuses, told to whoever gave it (the model, the
  operator), never a turn's end by itself.

`CODES` says, for every code a run ends with, whether asking again later may help
(`retryable`), whether a cheaper module may get past it (`falls_back`, the chat agent's
fallback), and whether the exception's message is the user's (`stated`). An exception may
carry a failure as its cause: the classifier (`stated`, `turn_failure`) walks the cause chain
and the first member of the family that states a failure decides.
"""

from dataclasses import dataclass

from fleet_agent.runners import Failed
from fleet_events.llm import LLM_FAILURES

CHAIN_LIMIT = 8
"""How far down an exception's causes a failure is looked for (dspy wraps ours in its own)."""


@dataclass(frozen=True)
class Code:
    """What a failure code means for the turn that ends with it."""

    retryable: bool
    falls_back: bool
    stated: bool


_LLM_RETRYABLE = frozenset(
    {"llm_timeout", "llm_rate_limited", "llm_unreachable", "llm_unavailable"}
)
_LLM_NO_FALLBACK = frozenset(
    {"llm_rate_limited", "llm_quota_exceeded", "llm_auth_failed", "llm_unreachable",
     "llm_model_not_found"}
)  # fmt: skip
"""Kinds another module cannot get past: it would ask the same server with the same key."""

RUNNER_ERROR = "runner_error"
NOT_CONFIGURED = "llm_not_configured"
SANDBOX_LOST = "sandbox_lost"
REPO_UNAVAILABLE = "repo_unavailable"
BUDGET_SPENT = "budget_spent"
NO_SUBMIT = "no_submit"
NOT_COMPUTED = "not_computed"

CODES: dict[str, Code] = {
    RUNNER_ERROR: Code(retryable=True, falls_back=True, stated=False),
    SANDBOX_LOST: Code(retryable=True, falls_back=False, stated=False),
    NOT_CONFIGURED: Code(retryable=False, falls_back=True, stated=True),
    REPO_UNAVAILABLE: Code(retryable=False, falls_back=False, stated=True),
    BUDGET_SPENT: Code(retryable=False, falls_back=False, stated=True),
    NO_SUBMIT: Code(retryable=True, falls_back=True, stated=True),
    NOT_COMPUTED: Code(retryable=False, falls_back=False, stated=True),
    **{
        code: Code(
            retryable=code in _LLM_RETRYABLE, falls_back=code not in _LLM_NO_FALLBACK, stated=True
        )
        for code in LLM_FAILURES
    },
}
"""Every code a run of this agent ends its turn with (the worker's `replica_lost` and `poison`
are the turn fold's, not a run's). A test holds it to `TURN_FAILURES`."""


def code_of(code: str) -> Code:
    """`code`'s meaning; an unknown code is the runner's error (never stated)."""
    return CODES.get(code, CODES[RUNNER_ERROR])


class AgentError(Exception):
    """The root of what the agent raises on purpose: a `code` for programs, whether asking
    again may help, and the failure it states to the user (None: it states none)."""

    code: str = RUNNER_ERROR

    @property
    def retryable(self) -> bool:
        return code_of(self.code).retryable

    def stated(self) -> Failed | None:
        """The turn's failure this states, message included; None for all but `RunFailure`."""
        return None


class RunFailure(AgentError):
    """Raised from anywhere in a run (a seam that cannot return `Failed`) for a reason safe to
    state: the turn ends `TurnFailed` with this message, code and flag, found anywhere in the
    exception's cause chain (dspy or a runner may wrap it)."""

    def __init__(self, message: str, *, code: str, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.code = code
        self._retryable = retryable

    @property
    def retryable(self) -> bool:
        return code_of(self.code).retryable if self._retryable is None else self._retryable

    @property
    def user_message(self) -> str:
        return str(self)

    def stated(self) -> Failed | None:
        return Failed(self.user_message, code=self.code, retryable=self.retryable)


class RunBroke(AgentError):
    """The run ended in a way the user is told only by its code and type (`run.failed` has the
    error, the replica's log the traceback): `runner_error`, or `sandbox_lost`."""

    def __init__(self, message: str, *, code: str = RUNNER_ERROR) -> None:
        super().__init__(message)
        self.code = code


class RunSignal(AgentError):
    """Not a failure: the run unwinds and its caller records what applies."""


class RunFenced(RunSignal, RuntimeError):
    """Another holder appended to this run's subject: this replica's view of the run is stale
    (it froze past its deadline and the run was taken over). It stops and records nothing."""


class RunCancelledError(RunSignal):
    """Raised inside dspy's loop at a step boundary once the run's cancel flag is set."""


class InputError(AgentError, ValueError):
    """A refusal of what a tool or a setting was given, told to whoever gave it."""


def chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its causes, nearest first (at most `CHAIN_LIMIT`, each once)."""
    seen: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(seen) < CHAIN_LIMIT and link not in seen:
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen


def stated(exc: BaseException) -> Failed | None:
    """The failure `exc` states: the first member of the family in its cause chain that
    states one; None when none does (the run broke)."""
    for link in chain(exc):
        if isinstance(link, AgentError):
            failure = link.stated()
            if failure is not None:
                return failure
    return None


def falls_back(exc: BaseException) -> bool:
    """May a cheaper module get past this? Not a failure that asks the same server again, nor
    a stated one that no answer can do without (the repository, the budget)."""
    failure = stated(exc)
    return failure is None or code_of(failure.code).falls_back


def broken_code(exc: BaseException) -> str:
    """The code of a run that broke: the family member's in the chain that names a known code
    (`sandbox_lost`), else `runner_error`."""
    for link in chain(exc):
        if isinstance(link, AgentError) and link.code in CODES:
            return link.code
    return RUNNER_ERROR


def turn_failure(exc: BaseException, replica: str) -> Failed:
    """How the turn ends when its runner raised `exc`: the failure it states, or a message
    that names only the type and where the details are (the text may hold anything, secrets
    included) with the code of what broke, and retryable."""
    failure = stated(exc)
    if failure is not None:
        return failure
    return Failed(
        f"the agent failed while running this turn ({type(exc).__name__}); "
        f"replica {replica}'s log has the details",
        code=broken_code(exc),
        retryable=True,
    )


def why(exc: BaseException, *, detailed: bool = False) -> str:
    """What a run's record says of `exc`: the type, with the message where it is ours and
    scrubbed (dspy's model errors, the budgeted LM's among them) or `detailed` asks for it (the
    engine's record, which has always kept it)."""
    from dspy.utils.exceptions import LMError  # lazily: the echo runner never loads dspy

    if detailed:
        return f"{type(exc).__name__}: {exc}"[:2000]
    if isinstance(exc, LMError):
        return f"{type(exc).__name__}: {exc}"[:1000]
    return type(exc).__name__


def not_configured_message(detail: str) -> str:
    """What `TurnFailed` says when the agent has no model to ask: what is missing and the ways
    to configure one (`detail` is the LM's own message, which names no key)."""
    return (
        f"the agent has no language model to answer with ({detail}). Configure one: point "
        "fleet up at an OpenAI-compatible server with FLEET_LLM_MODEL, FLEET_LLM_API_BASE and "
        "FLEET_LLM_API_KEY; or start fleet up without --llm none to serve the embedded local "
        "model; or store an LLM profile and bind the planner role to it (docs/llm.md). "
        "FLEET_AGENT_RUNNER=echo runs turns with no model at all"
    )


__all__ = [
    "BUDGET_SPENT",
    "CODES",
    "NOT_CONFIGURED",
    "NO_SUBMIT",
    "REPO_UNAVAILABLE",
    "RUNNER_ERROR",
    "SANDBOX_LOST",
    "AgentError",
    "Code",
    "InputError",
    "RunBroke",
    "RunCancelledError",
    "RunFailure",
    "RunFenced",
    "RunSignal",
    "broken_code",
    "chain",
    "code_of",
    "falls_back",
    "not_configured_message",
    "stated",
    "turn_failure",
    "why",
]
