"""Composition root of the budget service, built the same way by `main()` and by tests."""

import stamina

from fleet_budget.config import BudgetSettings
from fleet_budget.handlers import Budget
from fleet_budget.subscribers import subscribe
from fleet_events import streams
from fleet_mesh import service
from fleet_mesh.store import open_store


async def setup(ctx: service.ServiceContext, settings: BudgetSettings | None = None) -> None:
    settings = settings or BudgetSettings()
    # Lost races are routine under load and answered by catching up; a log line each is noise.
    stamina.instrumentation.set_on_retry_hooks([])
    store = await open_store(ctx.js, streams.BUDGET)
    budget = Budget(store, ctx.actor, settings)
    await subscribe(ctx, budget, concurrency=settings.concurrency)
    # Ping is served only after setup, so any pong means these subscriptions are live.
    ctx.ping_details = lambda: {"concurrency": settings.concurrency}


def main() -> None:
    service.run("budget", setup)
