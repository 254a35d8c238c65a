"""Composition root of the agent service, built the same way by `main()` and by tests.

Every replica runs both halves: the dispatcher (session logs → turn work items) and the turn
worker (work items → turns run), each a shared durable consumer, so replicas are
interchangeable and any one of them may die.
"""

import sys

from fleet_agent.chat.runner import chat_runner
from fleet_agent.config import AgentSettings, BadAgentSetting, load_settings
from fleet_agent.dispatcher import Dispatcher
from fleet_agent.engine.runner import engine_runner
from fleet_agent.profiles import open_stores, register_agent_verbs
from fleet_agent.runners import EchoRunner, ScriptedRunner, TurnRunner
from fleet_agent.turn_log import TurnLog
from fleet_agent.worker import TurnWorker
from fleet_events import streams
from fleet_events.codec import Codec
from fleet_mesh import service
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.secrets import private_key_from_env
from fleet_mesh.store import open_store
from fleet_mesh.work import WorkConsumer


def make_runner(settings: AgentSettings) -> TurnRunner:
    if settings.runner == "scripted":
        assert settings.barrier_dir is not None  # the settings refuse it otherwise
        return ScriptedRunner(settings.barrier_dir)
    return EchoRunner()


async def setup(ctx: service.ServiceContext, settings: AgentSettings | None = None) -> None:
    settings = settings or AgentSettings()
    store = await open_store(ctx.js, streams.SESSIONS)
    codec = Codec(await JetStreamBlobs.open(ctx.js))
    turn_log = TurnLog(store, codec, ctx.actor)
    dispatcher = Dispatcher(ctx.js, turn_log, ctx.log)
    if settings.runner == "chat":
        runner: TurnRunner = await chat_runner(ctx)
    elif settings.runner == "rlm":
        runner = await engine_runner(ctx)
    else:
        runner = make_runner(settings)
    worker = TurnWorker(
        ctx.nc, turn_log, codec, runner,
        replica=ctx.replica, max_attempts=settings.max_attempts, logger=ctx.log,
        cancel_poll_s=settings.ack_wait_s / 3,
        hold_before_ack=settings.barrier_dir if settings.hold_before_ack else None,
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

    async def configured(ctx: service.ServiceContext) -> None:
        await setup(ctx, settings)

    service.run("agent", configured)
