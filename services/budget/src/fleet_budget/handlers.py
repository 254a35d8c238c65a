"""The budget's use cases: validate, decide against the ledger, append; tenant days first.

A grant for a tenant with daily caps touches two ledgers. The tenant's day is charged first
and the tree second, so a crash in between can only over-count the tenant (the caller's retry,
with the same request id, finds the charge and does not repeat it) and never lets the tenant
exceed its cap. A charge whose tree grant is then refused is handed back (`TenantReleased`).
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fleet_budget.config import BudgetSettings
from fleet_budget.domain import (
    Command,
    Decision,
    TenantCaps,
    TenantDayState,
    TreeState,
    charge_cost,
    charge_tenant,
    decide,
    evolve,
    evolve_tenant,
    release,
    status,
    validate,
)
from fleet_budget.errors import Contended, Malformed, UnknownTree
from fleet_events import Actor, Envelope, Event, utc_now
from fleet_events.budget import (
    AdmitChild,
    AdmitReply,
    ChildRefused,
    CloseTree,
    GetStatus,
    Grant,
    Granted,
    GrantRefused,
    GrantReply,
    OpenRefused,
    OpenReply,
    OpenTree,
    RecordUsage,
    TenantCharged,
    TenantRefused,
    TreeStatus,
    UsageReply,
    tenant_day_subject,
    tree_subject,
)
from fleet_mesh import decider
from fleet_mesh.decider import Decider, Ledger
from fleet_mesh.store import EventStore, StoredEvent

S = TypeVar("S")


@dataclass(frozen=True)
class _Run:
    """The envelope context of a request: which run asked."""

    run: str | None = None
    session: str | None = None
    turn: str | None = None


def _clone_tree(state: TreeState) -> TreeState:
    """Deep enough for a group commit's scratch copy: every dict a grant's evolve writes."""
    return dataclasses.replace(state, decisions=dict(state.decisions), steps=dict(state.steps))


def _clone_day(state: TenantDayState) -> TenantDayState:
    return dataclasses.replace(state, decisions=dict(state.decisions))


def _fold_tree(state: TreeState, stored: StoredEvent) -> TreeState:
    return evolve(state, stored.envelope.id, stored.envelope.data)


def _fold_day(state: TenantDayState, stored: StoredEvent) -> TenantDayState:
    return evolve_tenant(state, stored.envelope.id, stored.envelope.data)


TREES = Ledger(name="budget-tree", initial=TreeState, evolve=_fold_tree, clone=_clone_tree)
TENANT_DAYS = Ledger(
    name="budget-tenant-day", initial=TenantDayState, evolve=_fold_day, clone=_clone_day
)


class Budget:
    def __init__(
        self,
        store: EventStore,
        actor: Actor,
        settings: BudgetSettings,
        *,
        today: Callable[[], str] = lambda: utc_now().date().isoformat(),
    ) -> None:
        self._actor = actor
        self._settings = settings
        self._today = today
        common: dict[str, Any] = {
            "capacity": settings.cached_ledgers,
            "attempts": settings.conflict_attempts,
            "deadline_s": settings.conflict_deadline_s,
        }
        self.trees = Decider(store, TREES, stale=(UnknownTree,), **common)
        self.tenants = Decider(store, TENANT_DAYS, **common)

    # --- use cases -------------------------------------------------------------------------

    async def open(self, command: OpenTree) -> OpenReply:
        validate(command)
        day = self._today()
        context = _Run(command.root_run, command.session, command.turn)
        decision = await self._submit(
            command, context, lambda s: decide(s, command, tenant_day=day)
        )
        now = await self._status(command.tree)
        if isinstance(decision.event, OpenRefused):
            return OpenReply(
                opened=False,
                reason=decision.event.reason,
                message=decision.event.message,
                status=now,
            )
        return OpenReply(opened=True, status=now)

    async def grant(self, command: Grant) -> GrantReply:
        validate(command)
        tree = await self._known(command.tree)
        caps = self._settings.caps_for(tree.tenant)
        refusal: TenantRefused | None = None
        charged = False
        if caps.any and _would_grant(tree, command):
            charge = await self._charge(tree, command.request_id, command.calls, caps)
            refusal = charge if isinstance(charge, TenantRefused) else None
            charged = isinstance(charge, TenantCharged)

        def answer(state: TreeState) -> Decision:
            return decide(state, command, tenant_refusal=refusal)

        decision = await self._submit(command, _Run(command.run), answer)
        if charged and decision.new and not isinstance(decision.event, Granted):
            await self._release(tree, command.request_id, command.calls)
        return _grant_reply(decision.event)

    async def record_usage(self, command: RecordUsage) -> UsageReply:
        validate(command)
        tree = await self._known(command.tree)
        if self._settings.caps_for(tree.tenant).cost_per_day is not None:
            await self._charge_cost(tree, command.request_id, command.cost)
        await self._submit(command, _Run(command.run), lambda s: decide(s, command))
        state = (await self.trees.current(tree_subject(command.tree))).state
        return UsageReply(
            tokens_used=state.tokens_used,
            cost_used=state.cost_used,
            calls_recorded=state.calls_recorded,
        )

    async def admit(self, command: AdmitChild) -> AdmitReply:
        validate(command)
        decision = await self._submit(
            command, _Run(command.parent_run), lambda s: decide(s, command)
        )
        max_depth = (await self.trees.current(tree_subject(command.tree))).state.max_depth
        match decision.event:
            case ChildRefused(reason=reason, message=message):
                return AdmitReply(
                    admitted=False,
                    depth=command.depth,
                    max_depth=max_depth,
                    reason=reason,
                    message=message,
                )
        return AdmitReply(admitted=True, depth=command.depth, max_depth=max_depth)

    async def close(self, command: CloseTree) -> TreeStatus:
        validate(command)
        await self._submit(command, _Run(), lambda s: decide(s, command))
        return await self._status(command.tree)

    async def status(self, query: GetStatus) -> TreeStatus:
        await self._known(query.tree, fresh=True)
        return await self._status(query.tree)

    # --- plumbing ----------------------------------------------------------------------------

    async def _status(self, tree: str) -> TreeStatus:
        cached = await self.trees.current(tree_subject(tree))
        return status(cached.state, cached.head.seq)

    async def _known(self, tree: str, *, fresh: bool = False) -> TreeState:
        """A tree unknown to this replica may have been opened through another one."""
        subject = tree_subject(tree)
        cached = await self.trees.current(subject, fresh=fresh)
        if not cached.state.opened:
            cached = await self.trees.current(subject, fresh=True)
        if not cached.state.opened:
            raise UnknownTree(tree)
        return cached.state

    async def _submit(
        self, command: Command, context: _Run, answer: Callable[[TreeState], Decision]
    ) -> Decision:
        def wrap(state: TreeState, event: Event) -> Envelope[Any]:
            tenant = command.tenant if isinstance(command, OpenTree) else state.tenant
            return self._envelope(
                command.request_id,
                tenant,
                event,
                run=context.run,
                session=context.session,
                turn=context.turn,
                correlation=command.tree,
            )

        subject = tree_subject(command.tree)
        return await _on(self.trees, subject, command.request_id, answer, wrap)

    async def _charge(
        self, tree: TreeState, request_id: str, calls: int, caps: TenantCaps
    ) -> Event:
        charge_id = _on_tenant(request_id)
        decision = await self._on_day(
            tree,
            charge_id,
            lambda s: charge_tenant(s, charge_id, tree.tree, calls, caps, tree.tenant_day),
        )
        return decision.event

    async def _charge_cost(self, tree: TreeState, request_id: str, cost: float) -> None:
        charge_id = _on_tenant(request_id)
        await self._on_day(tree, charge_id, lambda s: charge_cost(s, charge_id, tree.tree, cost))

    async def _release(self, tree: TreeState, request_id: str, calls: int) -> None:
        charge_id, release_id = _on_tenant(request_id), f"{request_id}:released"
        await self._on_day(
            tree, release_id, lambda s: release(s, release_id, tree.tree, charge_id, calls)
        )

    async def _on_day(
        self, tree: TreeState, event_id: str, answer: Callable[[TenantDayState], Decision]
    ) -> Decision:
        def wrap(_: TenantDayState, event: Event) -> Envelope[Any]:
            return self._envelope(event_id, tree.tenant, event, correlation=tree.tree)

        subject = tenant_day_subject(tree.tenant, tree.tenant_day)
        return await _on(self.tenants, subject, event_id, answer, wrap)

    def _envelope(
        self, event_id: str, tenant: str, data: Event, **context: str | None
    ) -> Envelope[Event]:
        return Envelope(
            id=event_id, tenant=tenant, actor=self._actor, ts=utc_now(), data=data, **context
        )


async def _on(
    ledgers: Decider[S],
    subject: str,
    request_id: str,
    answer: Callable[[S], Decision],
    wrap: Callable[[S, Event], Envelope[Any]],
) -> Decision:
    """Submit to the kernel; its refusals in the budget's own error families."""
    try:
        return await ledgers.submit(subject, answer, wrap, request_id=request_id)
    except decider.IdUsedElsewhere as exc:
        raise Malformed(str(exc)) from None
    except decider.Contended as exc:
        raise Contended(str(exc)) from None


def _would_grant(tree: TreeState, command: Grant) -> bool:
    """A preview on this replica's cache: only a grant the tree would give charges the tenant."""
    preview = decide(tree, command)
    return preview.new and isinstance(preview.event, Granted)


def _on_tenant(request_id: str) -> str:
    """The id of a tree request's charge on its tenant's day.

    JetStream deduplicates message ids across the whole stream, so the charge and the tree's
    decision cannot share the request id.
    """
    return f"{request_id}:tenant"


def _grant_reply(event: Event) -> GrantReply:
    match event:
        case Granted():
            return GrantReply(granted=True, calls=event.calls, remaining=event.remaining)
        case GrantRefused():
            return GrantReply(
                granted=False,
                calls=event.calls,
                remaining=event.remaining,
                reason=event.reason,
                message=event.message,
            )
    raise TypeError(f"a grant is answered by Granted or GrantRefused, not {event!r}")
