"""The decider kernel's pure part: how a group commit is decided (no server)."""

from dataclasses import dataclass, field, replace

import pytest

from fleet_events import Actor, Envelope, Event, utc_now
from fleet_events.chain import GENESIS
from fleet_events.session import TurnRequested
from fleet_mesh.decider import Decision, Ledger, Request, plan, provisional
from fleet_mesh.decider.plan import chains_on
from fleet_mesh.store import EMPTY, Head, StoredEvent

SUBJECT = "fleet.acme.session.s1.log"
ACTOR = Actor(service="test", replica="t-0")


@dataclass
class Slots:
    limit: int = 2
    taken: list[str] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)  # the positions folded in


def evolve(state: Slots, stored: StoredEvent) -> Slots:
    assert isinstance(stored.envelope.data, TurnRequested)
    assert stored.subject == SUBJECT
    state.taken.append(stored.envelope.data.message)
    state.seen.append(stored.seq)
    return state


LEDGER = Ledger(
    name="slots",
    initial=Slots,
    evolve=evolve,
    clone=lambda s: replace(s, taken=list(s.taken), seen=list(s.seen)),
)


class Unknown(Exception):
    pass


def take(name: str) -> Request[Slots, Decision[str]]:
    def decide(state: Slots) -> Decision[str]:
        if name == "bad":
            raise ValueError("malformed")
        if name in state.taken:
            return Decision(answer="already")
        if len(state.taken) >= state.limit:
            return Decision(answer="full")
        return Decision((TurnRequested(message=name),), answer="taken")

    return Request(name, decide, wrap)


def wrap(_: Slots, event: Event) -> Envelope[Event]:
    assert isinstance(event, TurnRequested)
    return Envelope(id=event.message, tenant="acme", session="s1", actor=ACTOR, ts=utc_now(),
                    data=event)  # fmt: skip


def answers(requests: list[Request[Slots, Decision[str]]], state: Slots) -> list[object]:
    planned = plan(LEDGER, SUBJECT, state, requests)
    return [a if isinstance(a, Exception) else a.answer for _, a in sorted(planned.answers.items())]


def test_one_request_is_decided_on_the_state_itself_and_nothing_is_folded_yet() -> None:
    state = Slots()
    planned = plan(LEDGER, SUBJECT, state, [take("a")])

    assert planned.state is state  # no copy for a lone request
    assert state.taken == []  # evolving waits for the append (with the real position)
    assert [e.id for e in planned.envelopes] == ["a"]
    assert planned.owners == [0]
    assert planned.stale is None


def test_a_batch_decides_each_request_on_the_state_after_the_ones_before() -> None:
    state = Slots(limit=2)
    requests = [take("a"), take("b"), take("a"), take("c")]

    planned = plan(LEDGER, SUBJECT, state, requests)

    assert answers(requests, Slots(limit=2)) == ["taken", "taken", "already", "full"]
    assert [e.id for e in planned.envelopes] == ["a", "b"]
    assert planned.owners == [0, 1]
    assert planned.state.taken == ["a", "b"]
    assert planned.state.seen == [0, 0]  # provisional: not stored yet
    assert state.taken == []  # the scratch copy, never the cached state


def test_an_exception_in_decide_answers_only_its_own_request() -> None:
    requests = [take("a"), take("bad"), take("b")]

    planned = plan(LEDGER, SUBJECT, Slots(), requests)

    assert isinstance(planned.answers[1], ValueError)
    assert [e.id for e in planned.envelopes] == ["a", "b"]
    assert planned.owners == [0, 2]


def test_a_decision_without_events_stores_nothing() -> None:
    planned = plan(LEDGER, SUBJECT, Slots(taken=["a"]), [take("a")])

    assert planned.envelopes == []
    assert planned.owners == []
    answer = planned.answers[0]
    assert isinstance(answer, Decision)
    assert answer.answer == "already"


def stale_until(known: str) -> Request[Slots, Decision[str]]:
    def decide(state: Slots) -> Decision[str]:
        if known not in state.taken:
            raise Unknown(known)
        return Decision((TurnRequested(message="after-" + known),), answer="ok")

    return Request("after-" + known, decide, wrap)


def test_a_stale_decide_stops_the_plan_until_the_state_is_caught_up() -> None:
    requests = [take("a"), stale_until("x"), take("b")]

    planned = plan(LEDGER, SUBJECT, Slots(limit=5), requests, stale=(Unknown,))

    assert planned.stale == 1
    assert 2 not in planned.answers  # nothing after the stale request was decided
    assert planned.state.taken == ["a"]  # what was planned before it

    final = plan(LEDGER, SUBJECT, Slots(limit=5), requests, stale=(Unknown,), caught_up=True)
    assert final.stale is None
    assert isinstance(final.answers[1], Unknown)  # caught up and still unknown: the answer
    assert [e.id for e in final.envelopes] == ["a", "b"]


def test_a_stale_error_not_named_stale_is_just_that_requests_answer() -> None:
    planned = plan(LEDGER, SUBJECT, Slots(), [stale_until("x"), take("b")])

    assert planned.stale is None
    assert isinstance(planned.answers[0], Unknown)
    assert [e.id for e in planned.envelopes] == ["b"]


def test_a_stale_request_decides_once_its_fact_is_folded() -> None:
    planned = plan(LEDGER, SUBJECT, Slots(taken=["x"]), [stale_until("x")], stale=(Unknown,))

    assert planned.stale is None
    assert [e.id for e in planned.envelopes] == ["after-x"]


def test_a_provisional_event_has_no_position_yet() -> None:
    event = wrap(Slots(), TurnRequested(message="a"))

    stored = provisional(SUBJECT, event)

    assert (stored.subject, stored.seq, stored.hash, stored.prev_hash) == (SUBJECT, 0, "", "")
    assert stored.envelope is event


@pytest.mark.parametrize(
    ("head", "prev", "continues"),
    [
        (EMPTY, "anything", True),  # a fold from nothing takes any start
        (EMPTY, None, True),
        (Head(7, "h7"), "h7", True),
        (Head(7, "h7"), "h6", False),  # purged and begun again: fold from the start
        (Head(7, "h7"), GENESIS, False),
        (Head(7, "h7"), None, False),
    ],
)
def test_a_tail_continues_the_fold_only_when_it_chains_on_its_head(
    head: Head, prev: str | None, continues: bool
) -> None:
    assert chains_on(head, prev) is continues


def test_two_requests_are_a_batch_the_second_deciding_on_the_first() -> None:
    state = Slots(limit=1)
    wrapped: list[list[str]] = []

    def seen_by_wrap(name: str) -> Request[Slots, Decision[str]]:
        request = take(name)

        def wrap_seeing(scratch: Slots, event: Event) -> Envelope[Event]:
            wrapped.append(list(scratch.taken))
            return wrap(scratch, event)

        return Request(name, request.decide, wrap_seeing)

    planned = plan(LEDGER, SUBJECT, state, [seen_by_wrap("a"), seen_by_wrap("a2")])

    assert answers([take("a"), take("a2")], Slots(limit=1)) == ["taken", "full"]
    assert planned.state.taken == ["a"]
    assert state.taken == []  # two requests are decided on a copy too
    assert wrapped == [[]]  # `wrap` sees the state its request was decided on


def test_each_event_of_a_batch_is_wrapped_with_the_state_after_the_ones_before() -> None:
    seen: list[list[str]] = []

    def wrap_seeing(scratch: Slots, event: Event) -> Envelope[Event]:
        seen.append(list(scratch.taken))
        return wrap(scratch, event)

    requests = [Request(n, take(n).decide, wrap_seeing) for n in ("a", "b", "c")]
    plan(LEDGER, SUBJECT, Slots(limit=3), requests)

    assert seen == [[], ["a"], ["a", "b"]]
