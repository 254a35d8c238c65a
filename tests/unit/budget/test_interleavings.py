"""Random interleavings of replicas with stale caches, lost acks and retried requests.

A model of the protocol the service runs on JetStream: each replica decides from its own
cached fold, appends only if its head is the ledger's head (the expected-sequence check), and
on a conflict folds the tail it missed and decides again. A "lost ack" stores the event but
leaves the replica's cache behind, as a crash between the append and the reply would.
"""

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_budget.domain import Command, Decision, TreeState, decide, evolve
from fleet_budget.errors import UnknownTree
from fleet_events.budget import (
    CloseTree,
    Grant,
    Granted,
    OpenTree,
    RecordUsage,
    TreeOpened,
)
from fleet_events.envelope import Event

LIMIT = 20


@dataclass
class Replica:
    state: TreeState = field(default_factory=TreeState)
    head: int = 0

    def catch_up(self, ledger: list[tuple[str, Event]]) -> None:
        for event_id, event in ledger[self.head :]:
            evolve(self.state, event_id, event)
        self.head = len(ledger)


def handle(
    replica: Replica, ledger: list[tuple[str, Event]], command: Command, *, lose_ack: bool
) -> Decision | None:
    while True:
        try:
            decision = decide(replica.state, command)
        except UnknownTree:
            if replica.head == len(ledger):
                return None
            replica.catch_up(ledger)
            continue
        if not decision.new:
            return decision
        if replica.head != len(ledger):  # the expected-sequence check fails: catch up, redo
            replica.catch_up(ledger)
            continue
        ledger.append((command.request_id, decision.event))
        if not lose_ack:
            evolve(replica.state, command.request_id, decision.event)
            replica.head = len(ledger)
        return decision


def command_for(kind: str, request_id: str, size: int) -> Command:
    match kind:
        case "open":
            return OpenTree(request_id=request_id, tenant="acme", tree="t", max_llm_calls=LIMIT)
        case "grant":
            return Grant(request_id=request_id, tree="t", run="r", calls=size)
        case "usage":
            return RecordUsage(request_id=request_id, tree="t", run="r", prompt_tokens=size)
        case _:
            return CloseTree(request_id=request_id, tree="t")


steps = st.lists(
    st.tuples(
        st.integers(0, 2),  # which replica gets the request
        st.sampled_from(["open", "grant", "grant", "grant", "usage", "close", "retry"]),
        st.integers(1, 6),  # grant size / tokens
        st.booleans(),  # the ack is lost
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_any_interleaving_keeps_grants_under_the_limit_and_retries_get_the_original(
    script: list[tuple[int, str, int, bool]],
) -> None:
    ledger: list[tuple[str, Event]] = []
    replicas = [Replica() for _ in range(3)]
    sent: list[Command] = []
    answers: dict[str, Event] = {}

    for index, (who, kind, size, lose_ack) in enumerate(script):
        if kind == "retry":
            if not sent:
                continue
            command = sent[size % len(sent)]
        else:
            command = command_for(kind, f"req{index}", size)
            sent.append(command)
        decision = handle(replicas[who], ledger, command, lose_ack=lose_ack)
        if decision is None:
            continue
        first = answers.setdefault(command.request_id, decision.event)
        assert decision.event == first  # a retry, on any replica, gets the original answer

    replayed = TreeState()
    for event_id, event in ledger:
        evolve(replayed, event_id, event)
    granted = sum(e.calls for _, e in ledger if isinstance(e, Granted))
    assert granted == replayed.granted <= LIMIT
    assert len({event_id for event_id, _ in ledger}) == len(ledger)  # no request stored twice
    assert sum(isinstance(e, TreeOpened) for _, e in ledger) <= 1
    for replica in replicas:
        replica.catch_up(ledger)
        # A cache that lost acks, once caught up, equals the replay: state is a pure fold.
        assert replica.state == replayed
