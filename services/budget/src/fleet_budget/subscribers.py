"""Thin adapters from `fleet.rpc.budget.<verb>` to the use cases, errors to RPC errors."""

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fleet_budget.errors import BudgetError, Malformed
from fleet_budget.handlers import Budget
from fleet_events import InvalidId, subjects
from fleet_events.budget import AdmitChild, CloseTree, GetStatus, Grant, OpenTree, RecordUsage
from fleet_mesh.rpc import BadRequest, RpcError
from fleet_mesh.service import ServiceContext

Req = TypeVar("Req")


def _answering(handler: Callable[[Req], Awaitable[Any]]) -> Callable[[Req], Awaitable[Any]]:
    async def answer(request: Req) -> Any:
        try:
            return await handler(request)
        except (Malformed, InvalidId) as exc:
            raise BadRequest(str(exc)) from None
        except BudgetError as exc:
            raise RpcError(exc.code, str(exc)) from None

    return answer


async def subscribe(ctx: ServiceContext, budget: Budget, *, concurrency: int) -> None:
    """Every verb in the `budget` queue group, up to `concurrency` requests at once per verb."""
    routes: list[tuple[str, type[Any], Callable[[Any], Awaitable[Any]]]] = [
        ("open", OpenTree, budget.open),
        ("grant", Grant, budget.grant),
        ("usage", RecordUsage, budget.record_usage),
        ("admit", AdmitChild, budget.admit),
        ("close", CloseTree, budget.close),
        ("status", GetStatus, budget.status),
    ]
    for verb, request_type, handler in routes:
        await ctx.serve(
            subjects.rpc("budget", verb),
            request_type,
            _answering(handler),
            concurrency=concurrency,
        )
