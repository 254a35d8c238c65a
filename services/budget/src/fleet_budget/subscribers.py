"""Thin adapters from `fleet.rpc.budget.<verb>` to the use cases, errors to RPC errors."""

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fleet_budget.errors import BudgetError, Malformed
from fleet_budget.handlers import Budget
from fleet_events import InvalidId, bus
from fleet_mesh.rpc import BadRequest, RpcError
from fleet_mesh.service import ServiceContext

Req = TypeVar("Req")
Rep = TypeVar("Rep")


def _answering(handler: Callable[[Req], Awaitable[Rep]]) -> Callable[[Req], Awaitable[Rep]]:
    async def answer(request: Req) -> Rep:
        try:
            return await handler(request)
        except (Malformed, InvalidId) as exc:
            raise BadRequest(str(exc)) from None
        except BudgetError as exc:
            raise RpcError(exc.code, str(exc)) from None

    return answer


async def subscribe(ctx: ServiceContext, budget: Budget, *, concurrency: int) -> None:
    """Every verb in the `budget` queue group, up to `concurrency` requests at once per verb."""
    await ctx.serve(bus.OPEN_TREE, _answering(budget.open), concurrency=concurrency)
    await ctx.serve(bus.GRANT, _answering(budget.grant), concurrency=concurrency)
    await ctx.serve(bus.RECORD_USAGE, _answering(budget.record_usage), concurrency=concurrency)
    await ctx.serve(bus.ADMIT_CHILD, _answering(budget.admit), concurrency=concurrency)
    await ctx.serve(bus.CLOSE_TREE, _answering(budget.close), concurrency=concurrency)
    await ctx.serve(bus.TREE_STATUS, _answering(budget.status), concurrency=concurrency)
