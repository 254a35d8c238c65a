"""Composition root of the agent service, built the same way by `main()` and by tests.

Tests plug their fakes in here (`runner`, `before_ack`: `fleet_harness.agent_fakes`, which also
runs the agent composed with them as a process); the agent holds no test code.

Every replica runs both halves: the dispatcher (session logs → turn work items) and the turn
worker (work items → turns run), each a shared durable consumer, so replicas are
interchangeable and any one of them may die.
"""

import sys
from collections.abc import Awaitable, Callable

from fleet_agent.chat.runner import chat_runner
from fleet_agent.config import AgentSettings, BadAgentSetting, load_settings
from fleet_agent.dispatcher import Dispatcher
from fleet_agent.engine.runner import engine_runner
from fleet_agent.profiles import open_stores, register_agent_verbs
from fleet_agent.runners import EchoRunner, TurnRunner
from fleet_agent.turn_log import TurnLog
from fleet_agent.worker import TurnWorker
from fleet_events import streams
from fleet_events.codec import Codec
from fleet_mesh import service
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.secrets import private_key_from_env
from fleet_mesh.store import open_store
from fleet_mesh.work import WorkConsumer

BeforeAck = Callable[[str, int], Awaitable[None]]
"""The worker's hook between a turn's stored end and its ack: (turn, attempt); tests only."""

FAKES_ONLY = (
    "FLEET_AGENT_RUNNER=scripted and FLEET_AGENT_HOLD_BEFORE_ACK are test fakes: start the agent "
    "with them as python -m fleet_harness.agent_fakes"
)


async def setup(
    ctx: service.ServiceContext,
    settings: AgentSettings | None = None,
    *,
    runner: TurnRunner | None = None,
    before_ack: BeforeAck | None = None,
) -> None:
    """`runner`: the turn runner, when a test brings its own (else the one `settings` names);
    `before_ack`: the worker's hook before each ack (a test's barrier)."""
    settings = settings or AgentSettings()
    if (settings.runner == "scripted" and runner is None) or (
        settings.hold_before_ack and before_ack is None
    ):
        raise BadAgentSetting(FAKES_ONLY)
    store = await open_store(ctx.js, streams.SESSIONS)
    codec = Codec(await JetStreamBlobs.open(ctx.js))
    turn_log = TurnLog(store, codec, ctx.actor)
    dispatcher = Dispatcher(ctx.js, turn_log, ctx.log)
    if runner is not None:
        pass
    elif settings.runner == "chat":
        runner = await chat_runner(ctx)
    elif settings.runner == "rlm":
        runner = await engine_runner(ctx)
    else:
        runner = EchoRunner()
    worker = TurnWorker(
        ctx.nc, turn_log, codec, runner,
        replica=ctx.replica, max_attempts=settings.max_attempts, logger=ctx.log,
        cancel_poll_s=settings.ack_wait_s / 3,
        before_ack=before_ack,
    )  # fmt: skip
    turns = WorkConsumer(
        ctx.js, settings.turn_consumer(), worker.handle, slots=settings.turn_slots, log=ctx.log
    )
    dispatch = WorkConsumer(
        ctx.js, settings.dispatch_consumer(), dispatcher.handle,
        slots=settings.dispatch_slots, log=ctx.log,
    )  # fmt: skip
    await turns.start()
    await dispatch.start()
    # agent.status / agent.test_lm (the gateway's runtime routes) need the secrets reader; a
    # replica without the key runs turns on the echo/scripted runners and says why it does not
    if private_key_from_env() is not None:
        await register_agent_verbs(ctx, await open_stores(ctx))
    else:
        ctx.log.warning("agent.status and agent.test_lm not served: FLEET_SECRETS_KEY is unset")

    async def stop() -> None:
        await dispatch.stop()
        await turns.stop()

    ctx.on_stop.append(stop)
    ctx.ping_details = lambda: {
        "turn_slots": turns.slots,
        "turns_running": turns.stats.running,
        "turns_peak": turns.stats.peak,
        "turns_handled": turns.stats.handled,
        "progress_sent": turns.stats.progress_sent,
        **getattr(runner, "ping_details", dict)(),
    }


def main() -> None:
    """A bad `FLEET_AGENT_*` setting ends the process before it connects, with one line that
    says which variable and what it may be (exit code 1)."""
    try:
        settings = load_settings()
    except BadAgentSetting as exc:
        sys.exit(f"agent: {exc}")
    if settings.runner == "scripted" or settings.hold_before_ack:
        sys.exit(f"agent: {FAKES_ONLY}")

    async def configured(ctx: service.ServiceContext) -> None:
        await setup(ctx, settings)

    service.run("agent", configured)
