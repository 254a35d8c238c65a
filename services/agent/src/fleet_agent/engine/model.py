"""What the engine is called with and what it answers: the contract the chat agent builds on.

`RunContext` holds only names and handles, no behaviour, so the chat agent, the turn runner
and a child-run worker build it the same way. Ids that a resumed run must find again (the root
run of a turn, a child run of a call, the turn's tree) are derived, not drawn at random: a
later attempt of the same turn lands on the same run subject and the same budget tree, and
the record it finds there is its own (issue 16 resumes from it; today a second attempt is
refused by the store's head check instead of writing a second history).
"""

import asyncio
import hashlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleet_agent.lm import LmServices
from fleet_agent.run.failures import CODES, RUNNER_ERROR, RunCancelledError, RunFenced
from fleet_agent.run.lifecycle import Cancelled, Completed, Failure, Outcome, result_code
from fleet_agent.run.seams import in_own_thread
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import Actor
from fleet_events.codec import Codec
from fleet_mesh.decider import Decider, Ledger
from fleet_mesh.store import EventStore

T = TypeVar("T")

DEFAULT_SIGNATURE = "task -> answer"

SESSION_FACTS: Ledger[None] = Ledger(
    name="session-facts", initial=lambda: None, evolve=lambda state, _: state,
    clone=lambda state: state, types=frozenset(),
)  # fmt: skip
"""A session's log as a writer of facts that commute with everyone else's sees it: no state
(no event is decoded), only the head the next append is made against."""


def derived_id(*parts: str) -> str:
    """A subject-safe id fixed by `parts` (32 hex characters, like `new_id`)."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:32]


def root_run_id(tenant: str, session: str, turn: str) -> str:
    return derived_id("root-run", tenant, session, turn)


def tree_id(tenant: str, session: str, turn: str) -> str:
    return derived_id("tree", tenant, session, turn)


def child_run_id(parent_run: str, call_id: str, index: int) -> str:
    return derived_id("child-run", parent_run, call_id, str(index))


@dataclass(frozen=True)
class RlmTask:
    """One RLM run: `signature` over `inputs`; `answer_field` is the output a parent reads.

    `max_llm_calls` is the whole tree's cap on sub calls (llm_query, facade sub-agents, child
    runs' calls), `max_iters` each run's own cap on steps; `max_depth` bounds recursion.
    """

    inputs: dict[str, Any]
    signature: str = DEFAULT_SIGNATURE
    answer_field: str = "answer"
    max_iters: int = 10
    max_llm_calls: int = 50
    max_depth: int = 3
    max_output_chars: int = 10_000
    planner_role: str = "planner"
    delegate_role: str = "delegate"
    cell_wall_s: float | None = None
    max_tree_calls: int = 500
    """Every model call of the whole tree (the budget's `max_tree_calls`)."""
    max_child_runs: int = 100


@dataclass(frozen=True)
class EngineMesh:
    """The engine's handles, all bound to `bus`'s loop (dspy calls them from its threads).

    One per tenant and replica: the bus names its tenant in every sandbox request.
    """

    bus: SandboxBus
    lm: LmServices
    store: EventStore
    codec: Codec
    actor: Actor
    facts: "Decider[None]" = field(init=False, repr=False, compare=False)
    """Appends the session facts a run states without deciding on the log's state (the
    session's sandbox): the decider kernel's append with `expect`, folded again on a lost race.
    On the bus's loop, as the store."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "facts", Decider(self.store, SESSION_FACTS))

    async def on_bus(self, work: Coroutine[Any, Any, T]) -> T:
        """Await `work` run on the bus's loop (where these handles live) from another loop."""
        return await asyncio.wrap_future(self.bus.submit(work))


class CancelFlag:
    """A cancel visible to dspy's threads: the turn's asyncio token lives on another loop."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._hooks: dict[int, Callable[[], object]] = {}
        self._next = 0
        self.reason = ""

    def set(self, reason: str) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            hooks = list(self._hooks.values())
        for hook in hooks:
            hook()

    def on_set(self, hook: Callable[[], object]) -> Callable[[], None]:
        """Call `hook` when the flag is set (at once if it is); returns its release."""
        with self._lock:
            self._next += 1
            key = self._next
            self._hooks[key] = hook
            already = self._event.is_set()
        if already:
            hook()

        def release() -> None:
            with self._lock:
                self._hooks.pop(key, None)

        return release

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    @property
    def is_set(self) -> bool:
        return self._event.is_set()


@dataclass
class RunContext:
    """Where a run runs: its session and turn, its budget tree, its place in the tree, its
    sandbox, and the flag that cancels it. `sandbox` is the sandbox whose REPL contexts the
    run's interpreters open (the session's, or a child sandbox from `build_child`)."""

    tenant: str
    session: str
    turn: str
    run: str
    tree: str
    sandbox: str
    mesh: EngineMesh
    depth: int = 0
    parent_run: str | None = None
    parent_call: str = ""
    cancel: CancelFlag = field(default_factory=CancelFlag)
    context: str | None = None
    """The REPL context the run's own interpreter opens (a child's, named by `build_child`:
    a fork's REPL state lives there); None: a fresh one."""
    deadline: float | None = None
    """The tree's deadline (seconds since the epoch): host tools waiting on child runs wait
    no longer (the broker's 600 s callback default is no bound for a tree)."""
    slot: "SlotLease | None" = None
    """The work slot this run holds, lent back while it waits on its children."""
    attempt: int = 1
    """Which attempt of the run this is (the turn's, or the child work item's delivery): a
    later one resumes from the run's record."""
    on_fork: "Callable[[str, Any], Awaitable[None]] | None" = None
    """Called with (old sandbox, new `SandboxInfo`) when a resume moved the run to a fork of
    its sandbox (`engine.resume`): the turn runner records it as the session's sandbox."""


class SlotLease:
    """A run's work slot, lent back to its consumer while the run waits on child runs.

    Called from dspy's threads; the consumer lives on the service's loop. Nested and parallel
    waits of one run lend the one slot once (a count), never more slots than the run holds.
    """

    def __init__(self, lend: Callable[[], object], reclaim: Callable[[], object]) -> None:
        self._lend = lend
        self._reclaim = reclaim
        self._lock = threading.Lock()
        self._waits = 0

    def begin_wait(self) -> None:
        with self._lock:
            self._waits += 1
            first = self._waits == 1
        if first:
            self._lend()

    def end_wait(self) -> None:
        with self._lock:
            self._waits -= 1
            last = self._waits == 0
        if last:
            self._reclaim()


@dataclass(frozen=True)
class RlmResult:
    """How the run ended. `status` is `completed`, `failed` or `cancelled`; `head_hash` is
    the run chain's head after its terminal event (a parent's `ChildRunCompleted` and the
    turn's `TurnCompleted` carry it)."""

    status: str
    answer: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    iterations: int = 0
    llm_calls: int = 0
    head_hash: str = ""
    retryable: bool = False
    fenced: bool = False
    """Another holder appended to the run: this replica recorded nothing more."""
    code: str = ""
    """Why a failed run failed, for programs: a code of the failure family (a model call's
    kind, `repo_unavailable`, `sandbox_lost`, ...), or "" for a run that broke."""

    @classmethod
    def ended(
        cls, outcome: Outcome, *, head_hash: str, iterations: int = 0, llm_calls: int = 0
    ) -> "RlmResult":
        """The result of a run that came to `outcome` (`run.lifecycle`)."""
        if isinstance(outcome, Completed):  # its own counts, as `run.completed` recorded them
            return cls(
                status="completed", answer=outcome.answer, outputs=outcome.outputs,
                head_hash=head_hash, iterations=outcome.iterations, llm_calls=outcome.llm_calls,
            )  # fmt: skip
        if isinstance(outcome, Cancelled):
            return cls(
                status="cancelled", answer=outcome.partial, head_hash=head_hash,
                iterations=iterations, llm_calls=llm_calls,
            )  # fmt: skip
        return cls(
            status="failed", error=outcome.error, retryable=outcome.retryable,
            code=result_code(outcome), head_hash=head_hash, iterations=iterations,
            llm_calls=llm_calls,
        )  # fmt: skip

    def outcome(self) -> Outcome:
        """What the run came to, as the lifecycle reads it (the turn's end is `turn_end`)."""
        if self.status == "completed":
            return Completed(self.answer, self.outputs, self.iterations, self.llm_calls)
        if self.status == "cancelled":
            return Cancelled(reason="", partial=self.answer)
        known = self.code in CODES
        return Failure(
            error=self.error, reason=self.code, code=self.code if known else RUNNER_ERROR,
            retryable=self.retryable, stated=known and CODES[self.code].stated,
        )  # fmt: skip


__all__ = [
    "DEFAULT_SIGNATURE",
    "CancelFlag",
    "EngineMesh",
    "RlmResult",
    "RlmTask",
    "RunCancelledError",
    "RunContext",
    "RunFenced",
    "SlotLease",
    "child_run_id",
    "derived_id",
    "in_own_thread",
    "root_run_id",
    "tree_id",
]
