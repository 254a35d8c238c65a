"""The ledger's rules: pure `decide` and `evolve`, no I/O, no clock, no asyncio.

A tree's state is a fold over its ledger. `decide` answers a command from that state with the
one event to append; it never mutates. `evolve` applies a stored event and also indexes its
envelope id (the request id) to the event, so a retried request is answered with the original
decision, whichever replica sees the retry. `evolve` updates the state in place and returns it:
a ledger's state is owned by one fold at a time, and copying a tree's request index on every
event would make replaying a tree quadratic.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fleet_budget.errors import Malformed, UnknownTree
from fleet_events.budget import (
    AdmitChild,
    ChildAdmitted,
    ChildRefused,
    CloseTree,
    Grant,
    Granted,
    GrantRefused,
    OpenRefused,
    OpenTree,
    RecordUsage,
    RefusalReason,
    TenantCharged,
    TenantRefused,
    TenantReleased,
    TreeClosed,
    TreeOpened,
    TreeStatus,
    UsageRecorded,
)
from fleet_events.envelope import Event
from fleet_events.ids import InvalidId, check_id

Command = OpenTree | Grant | RecordUsage | AdmitChild | CloseTree
TreeEvent = (
    TreeOpened | OpenRefused | Granted | GrantRefused | UsageRecorded | ChildAdmitted
    | ChildRefused | TreeClosed
)  # fmt: skip

MAX_CALLS_PER_GRANT = 10_000
MAX_REASON_CHARS = 500

_VERB_OF_EVENT: dict[type[Event], str] = {
    TreeOpened: "open",
    OpenRefused: "open",
    Granted: "grant",
    GrantRefused: "grant",
    UsageRecorded: "usage",
    ChildAdmitted: "admit",
    ChildRefused: "admit",
    TreeClosed: "close",
}
_VERB_OF_COMMAND: dict[type[Command], str] = {
    OpenTree: "open",
    Grant: "grant",
    RecordUsage: "usage",
    AdmitChild: "admit",
    CloseTree: "close",
}


@dataclass
class TreeState:
    tree: str = ""
    tenant: str = ""
    opened: bool = False
    closed: bool = False
    max_llm_calls: int = 0
    max_depth: int = 0
    max_tokens: int | None = None
    max_cost: float | None = None
    tenant_day: str = ""
    granted: int = 0
    tokens_used: int = 0
    cost_used: float = 0.0
    calls_recorded: int = 0
    refusals: int = 0
    max_steps_per_run: int | None = None
    max_tree_calls: int | None = None
    tree_calls: int = 0
    """Calls granted of every kind, to every run of the tree (what `max_tree_calls` bounds)."""
    max_child_runs: int | None = None
    child_runs: int = 0
    steps: dict[str, int] = field(default_factory=dict)
    """`step` calls granted per run: a run's own action and extract calls, which `max_iters`
    bounds and `max_llm_calls` does not count (DESIGN.md §5)."""
    decisions: dict[str, Event] = field(default_factory=dict)

    @property
    def remaining(self) -> int:
        return max(0, self.max_llm_calls - self.granted)


@dataclass(frozen=True)
class Decision:
    """The event that answers a command; `new` is False when it is a retry's original answer."""

    event: Event
    new: bool

    @property
    def events(self) -> tuple[Event, ...]:
        """What the decision stores: its event when new, nothing for a retry's answer."""
        return (self.event,) if self.new else ()


# --- validation: malformed requests store nothing -----------------------------------------


def _ids(**ids: str | None) -> None:
    for kind, value in ids.items():
        if value is None:
            continue
        try:
            check_id(kind.removesuffix("_id").replace("_", " "), value)
        except InvalidId as exc:
            raise Malformed(str(exc)) from None


def _count(name: str, value: int, *, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise Malformed(f"invalid {name} {value!r}: it must be a whole number {bound}")


def _money(name: str, value: float, *, positive: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "a finite number > 0" if positive else "a finite number >= 0"
        raise Malformed(f"invalid {name} {value!r}: it must be {need}")


def validate(command: Command) -> None:
    """Raise `Malformed` naming the field, the value and what to send instead."""
    match command:
        case OpenTree():
            _ids(request_id=command.request_id, tenant=command.tenant, tree=command.tree)
            _ids(session=command.session, turn=command.turn, root_run=command.root_run)
            _count("max_llm_calls", command.max_llm_calls, low=0)
            _count("max_depth", command.max_depth, low=0, high=64)
            if command.max_tokens is not None:
                _count("max_tokens", command.max_tokens, low=1)
            if command.max_cost is not None:
                _money("max_cost", command.max_cost, positive=True)
            if command.max_steps_per_run is not None:
                _count("max_steps_per_run", command.max_steps_per_run, low=1, high=10_000)
            if command.max_tree_calls is not None:
                _count("max_tree_calls", command.max_tree_calls, low=1, high=1_000_000)
            if command.max_child_runs is not None:
                _count("max_child_runs", command.max_child_runs, low=0, high=100_000)
        case Grant():
            _ids(request_id=command.request_id, tree=command.tree, run=command.run)
            _count("calls", command.calls, low=1, high=MAX_CALLS_PER_GRANT)
        case RecordUsage():
            _ids(request_id=command.request_id, tree=command.tree, run=command.run)
            _count("calls", command.calls, low=0, high=MAX_CALLS_PER_GRANT)
            _count("prompt_tokens", command.prompt_tokens, low=0)
            _count("completion_tokens", command.completion_tokens, low=0)
            _money("cost", command.cost)
        case AdmitChild():
            _ids(request_id=command.request_id, tree=command.tree)
            _ids(parent_run=command.parent_run, child_run=command.child_run)
            _count("depth", command.depth, low=1, high=65)
        case CloseTree():
            _ids(request_id=command.request_id, tree=command.tree)
            if len(command.reason) > MAX_REASON_CHARS:
                raise Malformed(f"close reason is {len(command.reason)} characters; keep it short")


# --- decide ----------------------------------------------------------------------------------


def _original(state: TreeState, command: Command) -> Decision | None:
    event = state.decisions.get(command.request_id)
    if event is None:
        return None
    verb = _VERB_OF_EVENT[type(event)]
    same = verb == _VERB_OF_COMMAND[type(command)]
    if same and isinstance(command, Grant | RecordUsage):
        same = getattr(event, "calls", None) == command.calls
    if same and isinstance(command, Grant) and isinstance(event, Granted):
        same = event.kind == command.kind
    if not same:
        raise Malformed(
            f"request_id {command.request_id!r} already answered a different request "
            f"({type(event).__name__}) on tree {state.tree!r}: a retry must repeat the same "
            "request; a new request needs a new request_id"
        )
    return Decision(event, new=False)


def decide(
    state: TreeState,
    command: Command,
    *,
    tenant_day: str = "",
    tenant_refusal: TenantRefused | None = None,
) -> Decision:
    """The answer to a validated command; raises `UnknownTree` before a tree is opened.

    `tenant_day` (an open's UTC date) names the tenant ledger the tree will charge; the caller
    passes the clock's reading so this function stays pure. `tenant_refusal`: the tenant's day
    declined a grant's charge, so a grant the tree would give is refused instead. Closing a
    closed tree stores nothing: it is already what the caller asked for.
    """
    original = _original(state, command)
    if original is not None:
        return original
    if isinstance(command, OpenTree):
        return Decision(_open(state, command, tenant_day), new=True)
    if not state.opened:
        raise UnknownTree(command.tree)
    match command:
        case Grant():
            event: Event = _grant(state, command)
            if tenant_refusal is not None and isinstance(event, Granted):
                event = refused_by_tenant(state, command, tenant_refusal)
        case CloseTree() if state.closed:
            return Decision(TreeClosed(reason="already closed"), new=False)
        case RecordUsage():
            event = UsageRecorded(
                run=command.run,
                calls=command.calls,
                prompt_tokens=command.prompt_tokens,
                completion_tokens=command.completion_tokens,
                cost=command.cost,
                model=command.model,
                role=command.role,
            )
        case AdmitChild():
            event = _admit(state, command)
        case CloseTree():
            event = TreeClosed(reason=command.reason)
    return Decision(event, new=True)


def _open(state: TreeState, command: OpenTree, tenant_day: str) -> Event:
    if state.opened:
        return OpenRefused(
            tree=command.tree,
            reason="already_open",
            message=f"tree {command.tree!r} is already open with max_llm_calls="
            f"{state.max_llm_calls}; its first limits stand. Use a new tree id for a new turn",
        )
    return TreeOpened(
        tree=command.tree,
        tenant=command.tenant,
        max_llm_calls=command.max_llm_calls,
        max_depth=command.max_depth,
        max_tokens=command.max_tokens,
        max_cost=command.max_cost,
        tenant_day=tenant_day,
        root_run=command.root_run,
        max_steps_per_run=command.max_steps_per_run,
        max_tree_calls=command.max_tree_calls,
        max_child_runs=command.max_child_runs,
    )


def _grant(state: TreeState, command: Grant) -> Granted | GrantRefused:
    remaining = state.remaining

    def refuse(reason: RefusalReason, message: str) -> GrantRefused:
        return GrantRefused(
            run=command.run,
            calls=command.calls,
            reason=reason,
            remaining=remaining,
            message=f"budget spent: {message}",
        )

    if state.closed:
        return refuse("tree_closed", f"tree {state.tree!r} is closed")
    cap = state.max_tree_calls
    if cap is not None and state.tree_calls + command.calls > cap:
        return refuse(
            "tree_calls_exhausted",
            f"asked for {command.calls} LLM call(s) with {state.tree_calls} of the tree's "
            f"max_tree_calls {cap} granted (every model call of the turn counts: each run's "
            "steps, sub calls and child runs); raise rlm_max_tree_calls or ask a narrower "
            "question",
        )
    if command.kind == "step":
        return _grant_step(state, command, refuse)
    if command.calls > remaining:
        return refuse(
            "calls_exhausted",
            f"asked for {command.calls} LLM call(s), {remaining} of {state.max_llm_calls} left",
        )
    if state.max_tokens is not None and state.tokens_used >= state.max_tokens:
        return refuse("tokens_exhausted", f"{state.tokens_used} of {state.max_tokens} tokens used")
    if state.max_cost is not None and state.cost_used >= state.max_cost:
        return refuse("cost_exhausted", f"cost {state.cost_used:.4f} of {state.max_cost:.4f}")
    return Granted(
        run=command.run,
        calls=command.calls,
        granted_total=state.granted + command.calls,
        remaining=remaining - command.calls,
    )


def _grant_step(
    state: TreeState, command: Grant, refuse: Callable[[RefusalReason, str], GrantRefused]
) -> Granted | GrantRefused:
    """A run's own step: bounded per run (its `max_iters`), not by the tree's call count;
    token and cost caps still hold, since a step's tokens cost the same as any other's."""
    used = state.steps.get(command.run, 0)
    cap = state.max_steps_per_run
    if cap is not None and used + command.calls > cap:
        return refuse(
            "calls_exhausted",
            f"run {command.run!r} asked for {command.calls} step call(s) with {used} of its "
            f"{cap} used (max_iters plus the extract step)",
        )
    if state.max_tokens is not None and state.tokens_used >= state.max_tokens:
        return refuse("tokens_exhausted", f"{state.tokens_used} of {state.max_tokens} tokens used")
    if state.max_cost is not None and state.cost_used >= state.max_cost:
        return refuse("cost_exhausted", f"cost {state.cost_used:.4f} of {state.max_cost:.4f}")
    return Granted(
        run=command.run,
        calls=command.calls,
        granted_total=state.granted,
        remaining=state.remaining,
        kind="step",
    )


def _admit(state: TreeState, command: AdmitChild) -> ChildAdmitted | ChildRefused:
    def refuse(reason: RefusalReason, message: str) -> ChildRefused:
        return ChildRefused(
            parent_run=command.parent_run,
            child_run=command.child_run,
            depth=command.depth,
            max_depth=state.max_depth,
            reason=reason,
            message=message,
        )

    if state.closed:
        return refuse("tree_closed", f"tree {state.tree!r} is closed: no new child runs")
    if command.depth > state.max_depth:
        return refuse(
            "depth_limit",
            f"child run at depth {command.depth} is over the tree's max_depth "
            f"{state.max_depth}: answer this sub-task without sub_rlm",
        )
    cap = state.max_child_runs
    if cap is not None and state.child_runs >= cap:
        return refuse(
            "child_runs_exhausted",
            f"the tree has admitted {state.child_runs} child runs, its max_child_runs {cap}: "
            "answer this sub-task without sub_rlm",
        )
    return ChildAdmitted(
        parent_run=command.parent_run, child_run=command.child_run, depth=command.depth
    )


def refused_by_tenant(state: TreeState, command: Grant, refusal: TenantRefused) -> GrantRefused:
    """The tree's record of a grant its tenant's daily cap declined."""
    return GrantRefused(
        run=command.run,
        calls=command.calls,
        reason=refusal.reason,
        remaining=state.remaining,
        message=f"budget spent: {refusal.message}",
    )


# --- evolve ----------------------------------------------------------------------------------


def evolve(state: TreeState, event_id: str, event: Event) -> TreeState:
    match event:
        case TreeOpened():
            state.tree = event.tree
            state.tenant = event.tenant
            state.opened = True
            state.max_llm_calls = event.max_llm_calls
            state.max_depth = event.max_depth
            state.max_tokens = event.max_tokens
            state.max_cost = event.max_cost
            state.tenant_day = event.tenant_day
            state.max_steps_per_run = event.max_steps_per_run
            state.max_tree_calls = event.max_tree_calls
            state.max_child_runs = event.max_child_runs
        case Granted(kind="step"):
            state.steps[event.run] = state.steps.get(event.run, 0) + event.calls
            state.tree_calls += event.calls
        case Granted():
            state.granted = event.granted_total
            state.tree_calls += event.calls
        case ChildAdmitted():
            state.child_runs += 1
        case UsageRecorded():
            state.tokens_used += event.prompt_tokens + event.completion_tokens
            state.cost_used += event.cost
            state.calls_recorded += event.calls
        case TreeClosed():
            state.closed = True
        case GrantRefused() | ChildRefused() | OpenRefused():
            state.refusals += 1
    state.decisions[event_id] = event
    return state


def status(state: TreeState, seq: int) -> TreeStatus:
    return TreeStatus(
        tree=state.tree,
        tenant=state.tenant,
        open=state.opened and not state.closed,
        max_llm_calls=state.max_llm_calls,
        granted=state.granted,
        remaining=state.remaining,
        max_depth=state.max_depth,
        max_tokens=state.max_tokens,
        max_cost=state.max_cost,
        tokens_used=state.tokens_used,
        cost_used=state.cost_used,
        calls_recorded=state.calls_recorded,
        refusals=state.refusals,
        seq=seq,
        max_tree_calls=state.max_tree_calls,
        tree_calls=state.tree_calls,
        max_child_runs=state.max_child_runs,
        child_runs=state.child_runs,
    )


# --- a tenant's daily ledger -----------------------------------------------------------------


@dataclass(frozen=True)
class TenantCaps:
    calls_per_day: int | None = None
    cost_per_day: float | None = None

    @property
    def any(self) -> bool:
        return self.calls_per_day is not None or self.cost_per_day is not None


@dataclass
class TenantDayState:
    calls: int = 0
    cost: float = 0.0
    decisions: dict[str, Event] = field(default_factory=dict)


def charge_tenant(
    state: TenantDayState, request_id: str, tree: str, calls: int, caps: TenantCaps, day: str
) -> Decision:
    """Count a grant's calls against the tenant's day before the tree grants them."""
    original = state.decisions.get(request_id)
    if original is not None:
        return Decision(original, new=False)
    if caps.cost_per_day is not None and state.cost >= caps.cost_per_day:
        return Decision(
            TenantRefused(
                tree=tree,
                calls=calls,
                reason="tenant_cost_exhausted",
                remaining_calls=_tenant_calls_left(state, caps),
                message=f"the tenant's daily cost cap {caps.cost_per_day:.4f} is reached "
                f"({state.cost:.4f} spent on {day} UTC)",
            ),
            new=True,
        )
    left = _tenant_calls_left(state, caps)
    if left is not None and calls > left:
        return Decision(
            TenantRefused(
                tree=tree,
                calls=calls,
                reason="tenant_calls_exhausted",
                remaining_calls=left,
                message=f"the tenant's daily cap of {caps.calls_per_day} LLM calls leaves {left} "
                f"on {day} UTC; asked for {calls}",
            ),
            new=True,
        )
    return Decision(TenantCharged(tree=tree, calls=calls), new=True)


def charge_cost(state: TenantDayState, charge_id: str, tree: str, cost: float) -> Decision:
    """A run's recorded cost counted on its tenant's day, once per `charge_id`."""
    return _once(state, charge_id, TenantCharged(tree=tree, cost=cost))


def release(state: TenantDayState, release_id: str, tree: str, charge: str, calls: int) -> Decision:
    """A charge handed back (its tree refused the grant), once per `release_id`."""
    return _once(state, release_id, TenantReleased(tree=tree, charge=charge, calls=calls))


def _once(state: TenantDayState, event_id: str, fact: Event) -> Decision:
    known = state.decisions.get(event_id)
    return Decision(known, new=False) if known is not None else Decision(fact, new=True)


def _tenant_calls_left(state: TenantDayState, caps: TenantCaps) -> int | None:
    if caps.calls_per_day is None:
        return None
    return max(0, caps.calls_per_day - state.calls)


def evolve_tenant(state: TenantDayState, event_id: str, event: Event) -> TenantDayState:
    match event:
        case TenantCharged():
            state.calls += event.calls
            state.cost += event.cost
        case TenantReleased():
            state.calls -= event.calls
    state.decisions[event_id] = event
    return state
