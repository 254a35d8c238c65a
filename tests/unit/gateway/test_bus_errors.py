"""One mapping from a bus request's failure to the edge's error (`routes.common.asking`), used
by the volume, sandbox and runtime routes alike: each failure gives its status, a code under
the service's prefix, and a message that names the service and says what to do."""

from collections.abc import Callable

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from fleet_gateway.errors import ApiError
from fleet_gateway.routes.common import AGENT, BROKER, Peer, Refusals, asking
from fleet_mesh import rpc


def _raised(
    peer: Peer,
    failure: BaseException,
    timeout: float = 10.0,
    *,
    refusals: Refusals | None = None,
    no_responders: Callable[[], ApiError] | None = None,
) -> ApiError:
    with (
        pytest.raises(ApiError) as caught,
        asking(peer, timeout, refusals=refusals, no_responders=no_responders),
    ):
        raise failure
    return caught.value


def _remote(code: str, message: str = "why") -> rpc.RemoteError:
    return rpc.RemoteError("fleet.verb.x", code, message)


@pytest.mark.parametrize(
    ("peer", "code", "message"),
    [
        (BROKER, "broker_unavailable", "no sandbox broker is running: start one and retry"),
        (AGENT, "agent_unavailable", "no agent is running to answer: start one and retry"),
    ],
)
def test_nobody_serving_the_verb_is_503_naming_the_missing_service(
    peer: Peer, code: str, message: str
) -> None:
    error = _raised(peer, NoRespondersError())
    assert (error.status, error.code, error.message) == (503, code, message)


@pytest.mark.parametrize("failure", [TimeoutError(), NatsTimeout()])
def test_no_answer_in_time_is_504_with_the_deadline_and_a_retry(failure: Exception) -> None:
    error = _raised(BROKER, failure, timeout=2.5)
    assert (error.status, error.code) == (504, "broker_timeout")
    assert error.message == "the sandbox broker did not answer within 2.5s; retry"
    agent = _raised(AGENT, failure, timeout=7.0)
    assert (agent.status, agent.code) == (504, "agent_timeout")
    assert agent.message == "the agent did not answer within 7.0s; retry"


def test_a_bad_request_refusal_is_the_callers_422_with_the_services_reason() -> None:
    error = _raised(AGENT, _remote("bad_request", "cursor 'zz' is not one of mine"))
    assert (error.status, error.code) == (422, "invalid_request")
    assert error.message == "the agent refused the request: cursor 'zz' is not one of mine"


def test_any_other_refusal_is_502_under_the_services_prefix_and_its_text_is_cut() -> None:
    error = _raised(BROKER, _remote("internal", "x" * 1000))
    assert (error.status, error.code) == (502, "broker_internal")
    assert error.message == "the sandbox broker refused: " + "x" * 300


def test_a_routes_own_refusals_come_before_the_generic_ones() -> None:
    def gone(exc: rpc.RemoteError) -> ApiError:
        return ApiError(404, "thing_not_found", f"no such thing ({exc.message})")

    refusals = {"not_found": gone, "bad_request": gone}
    error = _raised(BROKER, _remote("not_found", "sb-1"), refusals=refusals)
    assert (error.status, error.code, error.message) == (
        404, "thing_not_found", "no such thing (sb-1)"
    )  # fmt: skip
    assert _raised(BROKER, _remote("bad_request"), refusals=refusals).status == 404
    assert _raised(BROKER, _remote("declined"), refusals=refusals).code == "broker_declined"


def test_no_responders_can_mean_something_narrower_than_no_service() -> None:
    def no_holder() -> ApiError:
        return ApiError(404, "sandbox_not_found", "no live sandbox 'sb-1' in your tenant")

    error = _raised(BROKER, NoRespondersError(), no_responders=no_holder)
    assert (error.status, error.code) == (404, "sandbox_not_found")


def test_anything_else_passes_through_untouched() -> None:
    with pytest.raises(KeyError), asking(BROKER, 1.0):
        raise KeyError("not a bus failure")
    with asking(BROKER, 1.0):  # and a request that answers raises nothing
        pass
