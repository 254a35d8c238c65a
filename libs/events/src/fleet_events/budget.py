"""Budget context: the LLM-call ledger of each recursive tree (`fleet.budget.<tree>`).

Two kinds of ledger live on the BUDGET stream:

- `fleet.budget.<tree>`: one per tree (a turn's root run and all its descendants). Every
  decision about the tree is an event here, and its envelope id is the `request_id` that asked
  for it, so the ledger itself remembers which requests were answered and how.
- `fleet.budget.tenant.<tenant>.<day>`: one per tenant and UTC day, written only when that tenant
  has daily caps. Its extra tokens keep it disjoint from every tree subject.

The request/reply Structs of `fleet.rpc.budget.<verb>` live here too, so the agent imports
the protocol from the vocabulary and never from the budget service. See docs/budget.md for
the client's timeout and retry rule.
"""

from typing import Literal

import msgspec

from fleet_events import subjects
from fleet_events.envelope import Event

# --- subjects --------------------------------------------------------------------------------


def tree_subject(tree: str) -> str:
    return subjects.BUDGET_TREE.build(tree=tree)


def tenant_day_subject(tenant: str, day: str) -> str:
    """The tenant's daily ledger; `day` is the UTC date `YYYY-MM-DD` the tree was opened on."""
    return subjects.BUDGET_TENANT_DAY.build(tenant=tenant, day=day)


# --- events on a tree's ledger --------------------------------------------------------------

RefusalReason = Literal[
    "calls_exhausted",
    "tokens_exhausted",
    "cost_exhausted",
    "tree_closed",
    "tenant_calls_exhausted",
    "tenant_cost_exhausted",
    "depth_limit",
    "already_open",
    "tree_calls_exhausted",
    "child_runs_exhausted",
]


class TreeOpened(Event, frozen=True, kw_only=True, tag="budget.tree_opened"):
    """A turn's tree got its budget; `tenant_day` names the tenant ledger it charges."""

    tree: str
    tenant: str
    max_llm_calls: int
    max_depth: int
    max_tokens: int | None = None
    max_cost: float | None = None
    tenant_day: str = ""
    root_run: str | None = None
    max_steps_per_run: int | None = None
    max_tree_calls: int | None = None
    max_child_runs: int | None = None


class OpenRefused(Event, frozen=True, kw_only=True, tag="budget.open_refused"):
    """A second open of a tree, under a new request id: the first open's limits stand."""

    tree: str
    reason: RefusalReason
    message: str


class Granted(Event, frozen=True, kw_only=True, tag="budget.granted"):
    """`calls` LLM calls granted to `run`, all at once; totals as of this ledger position.

    A `step` grant (a run's own action or extract call) leaves `granted_total` and `remaining`
    as they were: those count the tree's `max_llm_calls`, which step calls do not draw on.
    """

    run: str
    calls: int
    granted_total: int
    remaining: int
    kind: str = "sub"


class GrantRefused(Event, frozen=True, kw_only=True, tag="budget.grant_refused"):
    """A grant declined, with the reason and the calls remaining at this ledger position."""

    run: str
    calls: int
    reason: RefusalReason
    remaining: int
    message: str


class UsageRecorded(Event, frozen=True, kw_only=True, tag="budget.usage_recorded"):
    """Tokens and cost of calls already made; checked against the caps before later grants."""

    run: str
    calls: int = 1
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    model: str = ""
    role: str = ""


class ChildAdmitted(Event, frozen=True, kw_only=True, tag="budget.child_admitted"):
    """A child run may start at `depth` (at most the tree's `max_depth`)."""

    parent_run: str
    child_run: str
    depth: int


class ChildRefused(Event, frozen=True, kw_only=True, tag="budget.child_refused"):
    """A child run declined: too deep, or the tree is closed."""

    parent_run: str
    child_run: str
    depth: int
    max_depth: int
    reason: RefusalReason
    message: str


class TreeClosed(Event, frozen=True, kw_only=True, tag="budget.tree_closed"):
    """No more grants or children; usage of calls still in flight is still recorded."""

    reason: str = ""


# --- events on a tenant's daily ledger --------------------------------------------------------


class TenantCharged(Event, frozen=True, kw_only=True, tag="budget.tenant_charged"):
    """Calls (before a grant) or cost (after a call) counted against a tenant's day.

    Its envelope id is the tree request's id, so a retried grant is charged once.
    """

    tree: str
    calls: int = 0
    cost: float = 0.0


class TenantRefused(Event, frozen=True, kw_only=True, tag="budget.tenant_refused"):
    """A tenant's daily cap declined a grant (the tree stores its own `GrantRefused` too)."""

    tree: str
    calls: int
    reason: RefusalReason
    remaining_calls: int | None
    message: str


class TenantReleased(Event, frozen=True, kw_only=True, tag="budget.tenant_released"):
    """Gives back a charge whose tree grant was then refused (another request got there first)."""

    tree: str
    charge: str
    calls: int


EVENTS: tuple[type[Event], ...] = (
    TreeOpened,
    OpenRefused,
    Granted,
    GrantRefused,
    UsageRecorded,
    ChildAdmitted,
    ChildRefused,
    TreeClosed,
    TenantCharged,
    TenantRefused,
    TenantReleased,
)


# --- requests and replies of fleet.rpc.budget.<verb> ----------------------------------------
# Ids and amounts are validated by the service with messages that say what to do; these
# Structs only fix the shape. Every request that may change the ledger carries `request_id`:
# it becomes the event id, and a retry with the same id gets the original answer.


class OpenTree(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    tenant: str
    tree: str
    max_llm_calls: int
    max_depth: int = 3
    max_tokens: int | None = None
    max_cost: float | None = None
    session: str | None = None
    turn: str | None = None
    root_run: str | None = None
    max_steps_per_run: int | None = None
    """How many `step` grants one run of the tree may get (its `max_iters` plus the extract
    step); None leaves them bounded by the engine's `max_iters` alone."""
    max_tree_calls: int | None = None
    """Every model call of the tree, whoever makes it: every run's steps and sub calls, the
    children's included (None: unbounded, as trees opened before the cap existed)."""
    max_child_runs: int | None = None
    """How many child runs the whole tree may admit, at every depth (None: unbounded)."""


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    """Ask for `calls` LLM calls, all or nothing (`llm_query_batched` reserves a batch).

    `kind` says what the call is: `step`, a run's own action or extract step (bounded by the
    run's `max_iters`), or `sub`, every other call (counted against `max_llm_calls`).
    """

    request_id: str
    tree: str
    run: str
    calls: int = 1
    kind: Literal["step", "sub"] = "sub"


class RecordUsage(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    tree: str
    run: str
    calls: int = 1
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    model: str = ""
    role: str = ""


class AdmitChild(msgspec.Struct, frozen=True, kw_only=True):
    """May `child_run`, spawned by `parent_run`, run at `depth` (the root run is depth 0)?"""

    request_id: str
    tree: str
    parent_run: str
    child_run: str
    depth: int


class CloseTree(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    tree: str
    reason: str = ""


class GetStatus(msgspec.Struct, frozen=True, kw_only=True):
    tree: str


class TreeStatus(msgspec.Struct, frozen=True, kw_only=True):
    tree: str
    tenant: str
    open: bool
    max_llm_calls: int
    granted: int
    remaining: int
    max_depth: int
    max_tokens: int | None
    max_cost: float | None
    tokens_used: int
    cost_used: float
    calls_recorded: int
    refusals: int
    seq: int
    max_tree_calls: int | None = None
    tree_calls: int = 0
    """Grants of every kind the tree gave (steps and sub calls, all its runs)."""
    max_child_runs: int | None = None
    child_runs: int = 0


class OpenReply(msgspec.Struct, frozen=True, kw_only=True):
    opened: bool
    reason: str = ""
    message: str = ""
    status: TreeStatus


class GrantReply(msgspec.Struct, frozen=True, kw_only=True):
    granted: bool
    calls: int
    remaining: int
    reason: str = ""
    message: str = ""


class UsageReply(msgspec.Struct, frozen=True, kw_only=True):
    tokens_used: int
    cost_used: float
    calls_recorded: int


class AdmitReply(msgspec.Struct, frozen=True, kw_only=True):
    admitted: bool
    depth: int
    max_depth: int
    reason: str = ""
    message: str = ""


# --- the client's rule (docs/budget.md) --------------------------------------------------------

ATTEMPT_TIMEOUT_S = 2.0
"""Each attempt waits this long for a reply; well above a grant's p99 including conflict retries."""

CLIENT_DEADLINE_S = 15.0
"""A caller stops retrying after this long in total and treats the call as refused."""

RETRYABLE_CODES = frozenset({"internal", "unavailable"})
"""Error codes after which the same request (same `request_id`) is sent again.

Silence (a timeout, no responders) is retried too. Every other code names a malformed request
and is final: sending it again would get the same answer.
"""
