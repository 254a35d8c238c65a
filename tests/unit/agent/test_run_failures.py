"""The agent's one failure family: every code a run ends with says whether asking again may
help, whether a cheaper module may get past it, and whether its message is the user's; the one
classifier finds a stated failure anywhere in the cause chain, and a turn whose runner raised
says only the type and where to look unless the exception states one."""

import itertools

import pytest

from fleet_agent.chat.documents import DocumentError
from fleet_agent.chat.escalation import UnknownMode
from fleet_agent.chat.react import EscalateToRlm, RlmRouteFailed
from fleet_agent.chat.tools import ParkTurn, ToolError
from fleet_agent.chat.urls import UrlRefused
from fleet_agent.config import BadAgentSetting
from fleet_agent.engine.sandboxes import RepoUnavailable
from fleet_agent.llm_failures import CallSite, LlmFailure
from fleet_agent.lm import BudgetSpent, LmCallFailed, LmNotConfigured
from fleet_agent.run import failures as f
from fleet_agent.runners import Failed
from fleet_agent.sandbox_bus import BusClosed
from fleet_events.llm import LLM_FAILURES

SITE = CallSite(profile="main", model="openai/x", role="planner", secret="s", timeout_s=20.0)

# code -> (retryable, falls back, stated): the table clients and the chat fallback rely on
TABLE = {
    "runner_error": (True, True, False),
    "sandbox_lost": (True, False, False),
    "llm_not_configured": (False, True, True),
    "repo_unavailable": (False, False, True),
    "budget_spent": (False, False, True),
    "no_submit": (True, True, True),
    "not_computed": (False, False, True),
    "llm_timeout": (True, True, True),
    "llm_rate_limited": (True, False, True),
    "llm_quota_exceeded": (False, False, True),
    "llm_auth_failed": (False, False, True),
    "llm_unreachable": (True, False, True),
    "llm_unavailable": (True, True, True),
    "llm_context_exceeded": (False, True, True),
    "llm_model_not_found": (False, False, True),
    "llm_bad_request": (False, True, True),
    "llm_error": (False, True, True),
}


def test_the_table_names_every_code_a_run_ends_with() -> None:
    assert set(f.CODES) == set(TABLE)
    assert set(LLM_FAILURES) <= set(f.CODES)


@pytest.mark.parametrize("code", sorted(TABLE))
def test_each_code_says_whether_to_retry_fall_back_and_state(code: str) -> None:
    retryable, falls_back, stated = TABLE[code]
    assert f.CODES[code] == f.Code(retryable=retryable, falls_back=falls_back, stated=stated)
    assert f.code_of(code) == f.CODES[code]


def test_an_unknown_code_means_the_runner_broke() -> None:
    assert f.code_of("no_such_code") == f.CODES["runner_error"]


def _llm(code: str) -> LmCallFailed:
    return LmCallFailed("provider text sk-key", LlmFailure(code=code, site=SITE))


@pytest.mark.parametrize("code", LLM_FAILURES)
def test_a_model_call_states_its_kind_with_the_profiles_message(code: str) -> None:
    failure = LlmFailure(code=code, site=SITE)
    said = f.stated(_llm(code))
    assert said == Failed(failure.message, code=code, retryable=TABLE[code][0])
    assert "provider text" not in said.error
    assert f.falls_back(_llm(code)) is TABLE[code][1]


def _message(exc: BaseException) -> str:
    said = f.stated(exc)
    assert said is not None
    return said.error


def test_each_stated_member_says_its_own_message() -> None:
    missing = LmNotConfigured("no profile is bound to the role planner")
    assert f.stated(missing) == Failed(_message(missing), code="llm_not_configured")
    assert _message(missing).startswith(
        "the agent has no language model to answer with (no profile is bound to the role planner)"
    )
    assert "FLEET_LLM_MODEL" in _message(missing)
    spent = BudgetSpent("budget spent: the tree's 50 calls")
    assert f.stated(spent) == Failed(_message(spent), code="budget_spent")
    assert _message(spent).startswith(
        "the budget refused this turn's model call: budget spent: the tree's 50 calls. "
    )
    repo = RepoUnavailable("https://example.org/r.git", "v1", "not found")
    assert f.stated(repo) == Failed(_message(repo), code="repo_unavailable")
    assert "'https://example.org/r.git' at 'v1': not found" in _message(repo)
    assert f.stated(f.RunFailure("said", code="llm_timeout", retryable=False)) == Failed(
        "said", code="llm_timeout", retryable=False
    )
    assert f.stated(f.RunFailure("said", code="llm_timeout")) == Failed(
        "said", code="llm_timeout", retryable=True
    )


def test_a_route_states_only_a_code_its_run_could_state() -> None:
    route = RlmRouteFailed("the route's message", "llm_auth_failed", False)
    assert f.stated(route) == Failed("the route's message", code="llm_auth_failed")
    assert f.stated(RlmRouteFailed("lost", "sandbox_lost", True)) is None
    assert f.broken_code(RlmRouteFailed("lost", "sandbox_lost", True)) == "sandbox_lost"
    assert f.stated(RlmRouteFailed("no answer")) is None
    assert f.broken_code(RlmRouteFailed("no answer", "ValueError")) == "runner_error"


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("no member"),
        LmCallFailed("recorded before kinds existed"),
        f.RunBroke("it broke"),
        f.RunFenced("another holder"),
        f.RunCancelledError("user"),
    ],
    ids=["plain", "no kind", "broke", "fenced", "cancelled"],
)
def test_what_states_nothing_is_not_stated_and_may_fall_back(exc: BaseException) -> None:
    assert f.stated(exc) is None
    assert f.falls_back(exc)


def test_the_first_stated_failure_down_the_chain_decides() -> None:
    first = BudgetSpent("budget spent: cap")
    second = _llm("llm_auth_failed")
    first.__cause__ = second
    outer = RuntimeError("dspy's own")
    outer.__context__ = first
    assert f.stated(outer) == f.stated(first)
    assert f.chain(outer) == [outer, first, second]


def test_the_chain_is_bounded_and_visits_each_link_once() -> None:
    links = [RuntimeError(str(n)) for n in range(20)]
    for outer, inner in itertools.pairwise(links):
        outer.__cause__ = inner
    assert f.chain(links[0]) == links[: f.CHAIN_LIMIT]
    loop = RuntimeError("a")
    back = RuntimeError("b")
    loop.__cause__, back.__cause__ = back, loop
    assert f.chain(loop) == [loop, back]
    deep = links[f.CHAIN_LIMIT]
    deep.__cause__ = BudgetSpent("budget spent: x")
    assert f.stated(links[0]) is None  # past the limit: not read


def test_a_runner_that_raised_ends_the_turn_by_type_code_and_where_to_look() -> None:
    failed = f.turn_failure(ValueError("secret sk-live"), "agent-3")
    assert failed == Failed(
        "the agent failed while running this turn (ValueError); replica agent-3's log has "
        "the details",
        code="runner_error", retryable=True,
    )  # fmt: skip
    lost = f.turn_failure(f.RunBroke("its REPL state is gone", code="sandbox_lost"), "a")
    assert (lost.code, lost.retryable) == ("sandbox_lost", True)
    assert "REPL" not in lost.error
    spent = BudgetSpent("budget spent: cap")
    assert f.turn_failure(spent, "a") == f.stated(spent)


def test_why_names_the_type_and_only_our_scrubbed_messages() -> None:
    assert f.why(ValueError("sk-live in it")) == "ValueError"
    assert f.why(ValueError("sk-live in it"), detailed=True) == "ValueError: sk-live in it"
    assert f.why(BudgetSpent("budget spent: cap")) == "BudgetSpent: budget spent: cap"
    assert f.why(BudgetSpent("x" * 3000)) == ("BudgetSpent: " + "x" * 3000)[:1000]


@pytest.mark.parametrize(
    ("exc", "branch"),
    [
        (BudgetSpent("budget spent: x"), f.RunFailure),
        (LmCallFailed("x"), f.RunFailure),
        (LmNotConfigured("x"), f.RunFailure),
        (RepoUnavailable("u", None, "x"), f.RunFailure),
        (RlmRouteFailed("x"), f.RunFailure),
        (f.RunBroke("x"), f.RunBroke),
        (BusClosed("x"), f.RunBroke),
        (f.RunFenced("x"), f.RunSignal),
        (f.RunCancelledError("x"), f.RunSignal),
        (EscalateToRlm.__new__(EscalateToRlm), f.RunSignal),
        (ToolError("x"), f.InputError),
        (DocumentError("x"), f.InputError),
        (UrlRefused("x"), f.InputError),
        (UnknownMode("x"), f.InputError),
        (BadAgentSetting("x"), f.InputError),
    ],
)
def test_every_exception_the_agent_raises_on_purpose_has_one_root(
    exc: BaseException, branch: type[f.AgentError]
) -> None:
    assert isinstance(exc, f.AgentError)
    assert isinstance(exc, branch)


def test_parking_is_not_an_error_so_no_handler_of_exceptions_can_swallow_it() -> None:
    assert not issubclass(ParkTurn, Exception)
