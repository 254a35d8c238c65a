"""Pure decisions of the broker: no I/O, no asyncio.

- `Stopwatch`: a cell's wall-time budget, paused while sandbox code waits on host tools.
- `decide_child`: the isolation policy for a recursive child (issue 5).
- `SandboxView` / `evolve`: what the log says about a sandbox, for list/get from any replica.
- `limits_problem`, `quota_problem`, `page`, `fit_reply`: what a request may ask for and how
  much of an answer fits on the wire.
- the lifecycle events, each built by one function here (the application layer only appends).
"""

import time
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import msgspec

from fleet_events import sandbox as ev
from fleet_events.envelope import Event
from fleet_sandbox_broker.errors import BadSpec


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
    seq: int = 0  # stream sequence of its first event: the order (and cursor) of `list`
    archived: bool = False
    """Archived with its provider: stopped, its files in the provider's keeping; no replica
    takes it over at start (a later `resume` revives it like any sandbox no broker holds)."""


def evolve(
    views: dict[str, SandboxView], tenant: str, event: Event, seq: int = 0
) -> dict[str, SandboxView]:
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
                parent=event.labels.get("parent"), seq=seq,
            )  # fmt: skip
        case ev.SandboxForked():
            views[event.sandbox] = SandboxView(
                event.sandbox, tenant, event.provider, event.replica, event.workspace,
                parent=event.parent, labels=dict(event.labels), limits=event.limits, seq=seq,
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
            # revived in place after a broker restart: same workspace, new process, and the
            # replica that revived it holds it now
            view = views[event.sandbox]
            views[event.sandbox] = replace(
                view, status="running", stopped_reason=None, contexts=(),
                replica=event.replica or view.replica, archived=False,
            )  # fmt: skip
        case ev.SandboxArchived() if event.sandbox in views:
            reason = f"archived: {event.reason}" if event.reason else "archived"
            views[event.sandbox] = replace(
                views[event.sandbox], status="stopped", stopped_reason=reason, contexts=(),
                archived=True,
            )  # fmt: skip
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


def orphaned(view: SandboxView, me: str, mine: Callable[[str], bool]) -> bool:
    """A sandbox this replica should take over at start: not deleted, held by another replica
    name, its workspace on this replica's disk (`mine`). Whether its holder is gone is asked
    on the bus (no responders on the sandbox's own subject) before acting."""
    if view.status == "deleted" or view.archived:
        return False
    return view.replica != me and mine(view.workspace)


# -- what a request may ask for --------------------------------------------------------------

Bounds = Mapping[str, tuple[float, float]]


def limits_problem(limits: ev.Limits, bounds: Bounds) -> str | None:
    """Why `limits` may not be granted, or None. Zero or negative limits would lift the rlimit
    they stand for, so every field is held to a floor as well as a ceiling."""
    for name in limits.__struct_fields__:
        value = getattr(limits, name)
        low, high = bounds[name]
        if not low <= value <= high:  # NaN fails too
            return (
                f"limits.{name}={value!r} is outside the allowed range [{low:g}, {high:g}]; "
                "ask for a value within it, or omit `limits` for the broker's defaults"
            )
    return None


def quota_problem(tenant: str, live: int, quota: int) -> str | None:
    """Why `tenant` may not start another sandbox now, or None (each one holds a host uid)."""
    if live < quota:
        return None
    return (
        f"tenant {tenant!r} already holds {live} live sandboxes, its quota is {quota}: "
        "delete sandboxes it no longer needs, then ask again"
    )


def page(
    views: Iterable[SandboxView], cursor: str | None, limit: int, max_limit: int
) -> tuple[list[SandboxView], str | None]:
    """One page, oldest first. The cursor is the stream sequence of the last item given, so
    a sandbox created or deleted between pages neither repeats nor hides another."""
    if not 1 <= limit <= max_limit:
        raise BadSpec(f"limit={limit} is outside the allowed range [1, {max_limit}]")
    after = 0
    if cursor is not None:
        if not cursor.isdigit() or len(cursor) > 19:
            raise BadSpec(
                f"cursor={cursor!r} is not a cursor this broker gave: pass a reply's "
                "`next_cursor` unchanged, or none for the first page"
            )
        after = int(cursor)
    chosen: list[SandboxView] = []
    for view in sorted((v for v in views if v.seq > after), key=lambda v: v.seq):
        if len(chosen) == limit:
            return chosen, str(chosen[-1].seq)
        chosen.append(view)
    return chosen, None


_encoder = msgspec.json.Encoder()


def _size(value: Any) -> int:
    return len(_encoder.encode(value))


def fit_reply(reply: ev.ExecuteReply, budget: int) -> ev.ExecuteReply:
    """The reply itself if its JSON fits in `budget` bytes; else its stdout and string value
    cut to fit (each keeps at least half the room if it needs it), or a value that is not a
    string replaced by a note, with `truncated` set and a note in each cut text, so the model
    reading it knows that part is missing."""
    if _size(reply) <= budget:
        return reply
    note = (
        f"\n[reply truncated to fit {budget} bytes; write large output to a file in the "
        "workspace and read it in parts]"
    )
    value = reply.value
    if value is not None and not isinstance(value, str):
        value = f"[the cell's value, {_size(value)} bytes as JSON, was dropped]"
    texts = {"stdout": reply.stdout, "value": value or ""}
    bare = replace_reply(reply, {"stdout": note, "value": note}, value is None, truncated=True)
    room = max(0, budget - _size(bare) - 64)
    sizes = {name: _size(text) - 2 for name, text in texts.items()}
    shares = dict.fromkeys(texts, room // 2)
    for name, other in (("stdout", "value"), ("value", "stdout")):
        if sizes[name] < room // 2:  # it needs less than half: the other gets the rest
            shares = {name: sizes[name], other: room - sizes[name]}
    for name, text in texts.items():
        if sizes[name] > shares[name]:
            texts[name] = _cut(text, sizes[name], shares[name]) + note
    return replace_reply(reply, texts, value is None, truncated=True)


def _cut(text: str, size: int, share: int) -> str:
    """The longest start of `text` whose JSON is about `share` bytes, never more."""
    kept = text[: len(text) * share // size]  # in proportion: escapes and UTF-8 weigh more
    over = _size(kept) - 2 - share
    # every character is at least one byte of JSON, so cutting `over` more always fits
    return kept[: max(0, len(kept) - over)] if over > 0 else kept


def replace_reply(
    reply: ev.ExecuteReply, texts: dict[str, str], no_value: bool, *, truncated: bool
) -> ev.ExecuteReply:
    return msgspec.structs.replace(
        reply,
        stdout=texts["stdout"],
        value=None if no_value else texts["value"],
        truncated=truncated,
    )


# -- lifecycle events: the one place each is built ---------------------------------------------


def created(
    sandbox: str, provider: str, replica: str, workspace: str, labels: dict[str, str],
    limits: ev.Limits, spec: Spec,
) -> ev.SandboxCreated:  # fmt: skip
    return ev.SandboxCreated(
        sandbox=sandbox, provider=provider, replica=replica, workspace=workspace, labels=labels,
        limits=limits, volume=spec.volume, volume_subpath=spec.volume_subpath,
        repo_url=spec.repo_url, ref=spec.ref, context_paths=list(spec.context_paths),
        local_checkout=spec.local_checkout,
    )  # fmt: skip


def forked(
    sandbox: str, parent: str, provider: str, replica: str, workspace: str,
    labels: dict[str, str], limits: ev.Limits,
) -> ev.SandboxForked:  # fmt: skip
    return ev.SandboxForked(
        sandbox=sandbox, parent=parent, provider=provider, replica=replica,
        workspace=workspace, labels=labels, limits=limits,
    )  # fmt: skip


def revived(sandbox: str, replica: str, why: str) -> ev.SandboxReplaced:
    """The same sandbox running again on its own workspace (files kept, REPL memory lost)."""
    return ev.SandboxReplaced(
        sandbox=sandbox, replaced=sandbox, replica=replica,
        reason=f"{why}: the sandbox runs again on the same workspace; REPL memory was lost, "
        "files were kept",
    )  # fmt: skip


def replacement(sandbox: str, replaced: str, replica: str, why: str) -> ev.SandboxReplaced:
    """A new sandbox standing in for a gone one, on the same volume and subpath."""
    return ev.SandboxReplaced(
        sandbox=sandbox,
        replaced=replaced,
        replica=replica,
        reason=f"{why}; REPL memory is lost, files on the volume are kept",
    )


def reaped(sandbox: str, why: str) -> ev.SandboxDeleted:
    return ev.SandboxDeleted(
        sandbox=sandbox, reason=f"reaped: {why}, and a child never outlives its task"
    )


def deleted(sandbox: str, reason: str) -> ev.SandboxDeleted:
    return ev.SandboxDeleted(sandbox=sandbox, reason=reason)


STOPS_NOT_RECORDED = ("deleted", "replaced")  # their own event says so
LIMITS: tuple[str, ...] = typing.get_args(typing.get_type_hints(ev.LimitExceeded)["limit"])


def stopped(sandbox: str, limit: str | None, reason: str | None) -> ev.LimitExceeded | None:
    """What a sandbox's stop records, or None for a stop another event already explains. A
    limit the event type does not name is recorded as `exited` with its detail: an event no
    reader could decode would be worse than a vaguer one."""
    if limit is None or (limit == "exited" and reason in STOPS_NOT_RECORDED):
        return None
    if limit not in LIMITS:
        reason, limit = f"{limit}: {reason or ''}", "exited"
    return ev.LimitExceeded(sandbox=sandbox, limit=limit, detail=reason or "")  # type: ignore[arg-type]


def context_opened(sandbox: str, context: str, interpreter: str | None) -> ev.ContextOpened:
    return ev.ContextOpened(sandbox=sandbox, context=context, interpreter=interpreter)


def context_closed(sandbox: str, context: str) -> ev.ContextClosed:
    return ev.ContextClosed(sandbox=sandbox, context=context)


def child_decided(
    parent: str, child: str | None, policy: ChildPolicy, plan: ChildPlan, context: str | None
) -> ev.ChildIsolationDecided:
    return ev.ChildIsolationDecided(
        parent=parent, child=None if plan.branch == "refused" else child, mode=policy.mode,
        branch=plan.branch, reason=plan.reason, context=context,
    )  # fmt: skip


def create_refused(
    sandbox: str, provider: str, reason: str, labels: dict[str, str], unrecorded: int
) -> ev.CreateRefused:
    return ev.CreateRefused(
        sandbox=sandbox, provider=provider, reason=reason, labels=labels, unrecorded=unrecorded
    )


def archive_refused(sandbox: str, provider: str, reason: str) -> ev.ArchiveRefused:
    return ev.ArchiveRefused(sandbox=sandbox, provider=provider, reason=reason)


def archived(sandbox: str, provider: str, reason: str) -> ev.SandboxArchived:
    return ev.SandboxArchived(sandbox=sandbox, provider=provider, reason=reason)


# -- the writer's decisions on a sandbox's own subject (the decider kernel appends them) --------


@dataclass
class SandboxLog:
    """What the writer folds of a sandbox's subject: where it ends."""

    seq: int = 0


def evolve_log(log: SandboxLog, seq: int) -> SandboxLog:
    log.seq = seq
    return log


@dataclass(frozen=True)
class Record:
    """Record a fact of a sandbox this replica holds (its one writer): after whatever is there."""

    event: Event


@dataclass(frozen=True)
class Claim:
    """Take a sandbox no broker holds (revive, reap or replace it): only if its subject still
    ends where the view saw it (`seen`; None: the view has no head for it). Of two replicas
    claiming one sandbox, exactly one is recorded."""

    seen: int | None
    event: Event


@dataclass(frozen=True)
class Decided:
    events: tuple[Event, ...]

    @property
    def recorded(self) -> bool:
        return bool(self.events)


def decide(log: SandboxLog, command: Record | Claim) -> Decided:
    if isinstance(command, Claim) and command.seen is not None and command.seen != log.seq:
        return Decided(())  # the sandbox moved since the view saw it: another replica has it
    return Decided((command.event,))
