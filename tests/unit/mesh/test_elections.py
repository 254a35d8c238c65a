"""A read asked again while a JetStream stream elects its leader, and only then."""

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import ServiceUnavailableError

from fleet_mesh.elections import through_election


def reads(*outcomes: object) -> tuple[list[int], object]:
    asked: list[int] = []

    async def read() -> object:
        asked.append(1)
        outcome = outcomes[len(asked) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return asked, read


async def test_a_read_unanswered_during_an_election_is_asked_again_until_answered() -> None:
    asked, read = reads(NatsTimeout(), ServiceUnavailableError(), "info")
    assert await through_election(read, within=5, pause=0.001) == "info"  # type: ignore[arg-type]
    assert len(asked) == 3


async def test_past_its_bound_the_last_timeout_is_raised() -> None:
    asked, read = reads(*[NatsTimeout()] * 1000)
    with pytest.raises(NatsTimeout):
        await through_election(read, within=0.05, pause=0.01)  # type: ignore[arg-type]
    assert 2 <= len(asked) < 1000


async def test_any_other_failure_is_not_asked_again() -> None:
    asked, read = reads(NoRespondersError(), "never")
    with pytest.raises(NoRespondersError):
        await through_election(read, within=5, pause=0.001)  # type: ignore[arg-type]
    assert len(asked) == 1
