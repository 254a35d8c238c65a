"""The budget's use cases: validate, decide against the ledger, append; tenant days first.

A grant for a tenant with daily caps touches two ledgers. The tenant's day is charged first
and the tree second, so a crash in between can only over-count the tenant (the caller's retry,
with the same request id, finds the charge and does not repeat it) and never lets the tenant
exceed its cap. A charge whose tree grant is then refused is handed back (`TenantReleased`).
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet_budget.config import BudgetSettings
from fleet_budget.domain import (
    Command,
    Decision,
    TenantCaps,
    TenantDayState,
    TreeState,
    charge_tenant,
    decide,
    evolve,
    evolve_tenant,
    refused_by_tenant,
    status,
    validate,
)
from fleet_budget.errors import UnknownTree
from fleet_budget.ledger import Ledgers, envelope_for
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
    TenantReleased,
    TreeClosed,
    TreeStatus,
    UsageReply,
    tenant_day_subject,
    tree_subject,
)
from fleet_mesh.store import EventStore


@dataclass(frozen=True)
class _Run:
    """The envelope context of a request: which run asked."""

    run: str | None = None
    session: str | None = None
    turn: str | None = None


def _clone_tree(state: TreeState) -> TreeState:
    return dataclasses.replace(state, decisions=dict(state.decisions))


def _clone_day(state: TenantDayState) -> TenantDayState:
    return dataclasses.replace(state, decisions=dict(state.decisions))


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
        self.trees: Ledgers[TreeState] = Ledgers(
            store, initial=TreeState, evolve=evolve, clone=_clone_tree, stale=(UnknownTree,),
            **common,
        )  # fmt: skip
        self.tenants: Ledgers[TenantDayState] = Ledgers(
            store, initial=TenantDayState, evolve=evolve_tenant, clone=_clone_day, **common
        )

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
            decision = decide(state, command)
            if decision.new and isinstance(decision.event, Granted) and refusal:
                return Decision(refused_by_tenant(state, command, refusal), new=True)
            return decision

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
        await self._submit(command, _Run(), lambda s: _close(s, command))
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
            return envelope_for(
                self._actor,
                command.request_id,
                tenant,
                event,
                run=context.run,
                session=context.session,
                turn=context.turn,
                correlation=command.tree,
            )

        return await self.trees.submit(tree_subject(command.tree), command.request_id, answer, wrap)

    async def _charge(
        self, tree: TreeState, request_id: str, calls: int, caps: TenantCaps
    ) -> Event:
        charge_id = _on_tenant(request_id)
        decision = await self.tenants.submit(
            tenant_day_subject(tree.tenant, tree.tenant_day),
            charge_id,
            lambda s: charge_tenant(s, charge_id, tree.tree, calls, caps, tree.tenant_day),
            self._tenant_envelope(tree, charge_id),
        )
        return decision.event

    async def _charge_cost(self, tree: TreeState, request_id: str, cost: float) -> None:
        charge = TenantCharged(tree=tree.tree, cost=cost)
        await self._tenant_fact(tree, _on_tenant(request_id), charge)

    async def _release(self, tree: TreeState, request_id: str, calls: int) -> None:
        released = TenantReleased(tree=tree.tree, charge=_on_tenant(request_id), calls=calls)
        await self._tenant_fact(tree, f"{request_id}:released", released)

    async def _tenant_fact(self, tree: TreeState, event_id: str, event: Event) -> None:
        def once(state: TenantDayState) -> Decision:
            known = state.decisions.get(event_id)
            return Decision(known, new=False) if known else Decision(event, new=True)

        await self.tenants.submit(
            tenant_day_subject(tree.tenant, tree.tenant_day),
            event_id,
            once,
            self._tenant_envelope(tree, event_id),
        )

    def _tenant_envelope(
        self, tree: TreeState, event_id: str
    ) -> Callable[[TenantDayState, Event], Envelope[Any]]:
        return lambda _, event: envelope_for(
            self._actor, event_id, tree.tenant, event, correlation=tree.tree
        )


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


def _close(state: TreeState, command: CloseTree) -> Decision:
    """Closing a closed tree stores nothing: it is already what the caller asked for."""
    if state.closed and command.request_id not in state.decisions:
        return Decision(TreeClosed(reason="already closed"), new=False)
    return decide(state, command)


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
