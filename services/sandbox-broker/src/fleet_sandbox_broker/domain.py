"""Pure decisions of the broker: no I/O, no asyncio.

- `Stopwatch`: a cell's wall-time budget, paused while sandbox code waits on host tools.
- `decide_child`: the isolation policy for a recursive child (issue 5).
- `SandboxView` / `evolve`: what the log says about a sandbox, for list/get from any replica.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from fleet_events import sandbox as ev
from fleet_events.envelope import Event


class Stopwatch:
    """Counts a cell's running time; time with at least one host callback pending is excluded."""

    def __init__(self, budget_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_s = budget_s
        self._clock = clock
        self._spent = 0.0
        self._since: float | None = clock()
        self._waiting = 0

    @property
    def paused(self) -> bool:
        return self._waiting > 0

    def pause(self) -> None:
        if self._waiting == 0 and self._since is not None:
            self._spent += self._clock() - self._since
            self._since = None
        self._waiting += 1

    def resume(self) -> None:
        self._waiting -= 1
        if self._waiting == 0:
            self._since = self._clock()

    def spent(self) -> float:
        running = 0.0 if self._since is None else self._clock() - self._since
        return self._spent + running

    def remaining(self) -> float:
        return self.budget_s - self.spent()


Mode = Literal["auto", "context"]
Fallback = Literal["clean", "none"]
Branch = Literal["fork", "clean_volume", "clean_fallback", "context", "refused"]


@dataclass(frozen=True)
class ChildPolicy:
    mode: Mode = "auto"
    fallback: Fallback = "clean"


@dataclass(frozen=True)
class ParentFacts:
    has_volume: bool
    provider_can_fork: bool


@dataclass(frozen=True)
class ChildPlan:
    branch: Branch
    reason: str


def decide_child(policy: ChildPolicy, parent: ParentFacts) -> ChildPlan:
    """The first choice for a child's sandbox; `after_fork_failure` handles a failed fork."""
    if policy.mode == "context":
        return ChildPlan(
            "context",
            "RLM_CHILD_ISOLATION_MODE=context: fresh REPL context in the "
            "parent's sandbox (debugging only)",
        )
    if parent.has_volume:
        return ChildPlan(
            "clean_volume",
            "the parent has a durable volume: clean child with the "
            "same repo/ref/context paths and a child-specific volume subpath",
        )
    if not parent.provider_can_fork:
        return after_fork_failure(policy, "the provider cannot fork")
    return ChildPlan("fork", "the parent has no durable volume: fork it")


def after_fork_failure(policy: ChildPolicy, error: str) -> ChildPlan:
    if policy.fallback == "clean":
        return ChildPlan(
            "clean_fallback", f"fork failed ({error}); RLM_CHILD_FORK_FALLBACK=clean: clean child"
        )
    return ChildPlan("refused", f"fork failed ({error}) and RLM_CHILD_FORK_FALLBACK=none")


@dataclass(frozen=True)
class Spec:
    """What a sandbox was made from; a clean child or a replacement is made from it again."""

    volume: str | None = None
    volume_subpath: str | None = None
    repo_url: str | None = None
    ref: str | None = None
    context_paths: tuple[str, ...] = ()
    local_checkout: bool = False


@dataclass(frozen=True)
class SandboxView:
    sandbox: str
    tenant: str
    provider: str
    replica: str
    workspace: str
    status: Literal["running", "stopped", "deleted"] = "running"
    parent: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    contexts: tuple[str, ...] = ()
    stopped_reason: str | None = None
    spec: Spec = field(default_factory=Spec)
    limits: ev.Limits = field(default_factory=ev.Limits)


def evolve(views: dict[str, SandboxView], tenant: str, event: Event) -> dict[str, SandboxView]:
    """Fold one lifecycle event into the views of a tenant's sandboxes (mutates `views`)."""
    match event:
        case ev.SandboxCreated():
            spec = Spec(
                event.volume, event.volume_subpath, event.repo_url, event.ref,
                tuple(event.context_paths), event.local_checkout,
            )  # fmt: skip
            views[event.sandbox] = SandboxView(
                event.sandbox, tenant, event.provider, event.replica, event.workspace,
                labels=dict(event.labels), spec=spec, limits=event.limits,
                parent=event.labels.get("parent"),
            )  # fmt: skip
        case ev.SandboxForked():
            views[event.sandbox] = SandboxView(
                event.sandbox, tenant, event.provider, event.replica, event.workspace,
                parent=event.parent, labels=dict(event.labels), limits=event.limits,
            )  # fmt: skip
        case ev.ContextOpened() if event.sandbox in views:
            view = views[event.sandbox]
            views[event.sandbox] = replace(view, contexts=(*view.contexts, event.context))
        case ev.ContextClosed() if event.sandbox in views:
            view = views[event.sandbox]
            kept = tuple(c for c in view.contexts if c != event.context)
            views[event.sandbox] = replace(view, contexts=kept)
        case ev.LimitExceeded() if event.sandbox in views:
            views[event.sandbox] = replace(
                views[event.sandbox], status="stopped", stopped_reason=event.detail
            )
        case ev.SandboxReplaced() if event.sandbox == event.replaced and event.sandbox in views:
            # revived in place after a broker restart: same workspace, new process
            views[event.sandbox] = replace(
                views[event.sandbox], status="running", stopped_reason=None, contexts=()
            )
        case ev.SandboxDeleted() if event.sandbox in views:
            views[event.sandbox] = replace(views[event.sandbox], status="deleted")
        case _:
            pass
    return views


def to_reap(view: SandboxView, run_finished: bool = False) -> bool:
    """After a broker restart: children never outlive their task, nor does a sandbox whose run
    the log says is finished; a session's sandbox (role `session`) lives on."""
    if view.labels.get("role") == "session" and view.parent is None:
        return False
    return view.parent is not None or view.labels.get("role") == "child" or run_finished
