"""Chat agent benchmark: one ChainOfThought turn through `ChatRunner` beside the same
`dspy.ChainOfThought` call on a plain `dspy.LM`, both against the scripted LM (a FAKE model
server) on loopback.

The difference is what the chat agent adds to a turn that needs one model call: the session
fold (a replay of the session's subjects), the budget tree's open and close, the budgeted LM
(profile lookup, grant, usage) and the run's record (run.started, run.llm_called,
run.iteration_planned, run.completed, each a durable append). Each turn gets a session of its
own (the `TurnRequested` is appended before timing, as the gateway would). Printed at zero model
latency (the overhead itself) and at a fixed latency standing in for a fast real model.

Run: `.venv/bin/python bench/chat.py [--quick]`. Starts its own nats-server, bootstrap, one
budget replica and the fake.
"""

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# the bench's model server is a fake on loopback, and a tenant's profile may reach public
# addresses only: this bench deployment allows loopback, as the suite does (conftest.py)
os.environ.setdefault("FLEET_EGRESS_ALLOW", "127.0.0.0/8")

import dspy
from dspy.clients.engines.litellm_engine import LiteLLMEngine

from fleet_agent.chat.runner import ChatOptions, ChatRunner
from fleet_agent.chat.signatures import ChatTurn
from fleet_agent.engine.mesh import MeshPool
from fleet_agent.engine.model import RlmTask
from fleet_agent.runners import CancelToken, TurnInput
from fleet_events import Actor, Envelope, new_id, streams, utc_now
from fleet_events.llm import LlmProfile
from fleet_events.session import TurnRequested, log_subject
from fleet_harness.bench import report, side_by_side
from fleet_harness.procs import Launcher
from fleet_harness.scripted_lm import ScriptedLM
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import ensure_keypair, load_private_key
from fleet_mesh.store import EMPTY, open_store
from lm import wait_budget

MODEL = "openai/scripted"
TENANT = "bench"
REPLY = (
    "[[ ## reasoning ## ]]\neasy\n\n[[ ## answer ## ]]\nfour\n\n"
    "[[ ## needs_tools ## ]]\nFalse\n\n[[ ## completed ## ]]\n"
)
GATEWAY = Actor(service="gateway", replica="bench")


async def main(samples: int, latency_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = NatsServer(store_dir=root / "nats", log_path=root / "nats.log").start()
        launcher = Launcher(nats_url=server.url, log_dir=root)
        try:
            nc = await connect(server.url, name="bench-chat")
            await bootstrap(nc.jetstream(), env={})
            launcher.start("budget")
            await wait_budget(server.url)
            key = load_private_key(ensure_keypair(root / "secrets").private)
            pool = MeshPool(server.url, Actor(service="agent", replica="bench"), key)
            try:
                for latency in (0.0, latency_s):
                    with ScriptedLM(lambda _: REPLY, latency_s=latency) as fake:
                        await run_pair(nc, pool, fake, samples, latency)
            finally:
                await asyncio.to_thread(pool.close)
                await nc.close()
        finally:
            launcher.stop_all()
            server.stop()


async def run_pair(
    nc: object, pool: MeshPool, fake: ScriptedLM, samples: int, latency: float
) -> None:
    js = nc.jetstream()  # type: ignore[attr-defined]
    config = await LlmConfig.open(js)
    await config.put_profile(
        LlmProfile(name="bench", model=MODEL, api_base=fake.base_url), tenant=TENANT
    )
    await config.set_role("planner", "bench", tenant=TENANT)
    store = await open_store(js, streams.SESSIONS)
    turns: list[TurnInput] = []
    for _ in range(samples + 10):
        session, turn = new_id(), new_id()
        envelope = Envelope(
            id=new_id(), tenant=TENANT, session=session, turn=turn, actor=GATEWAY,
            ts=utc_now(), data=TurnRequested(message="What is two plus two?"),
        )  # fmt: skip
        await store.append(log_subject(TENANT, session), envelope, expect=EMPTY)
        turns.append(TurnInput(TENANT, session, turn, "What is two plus two?", 1, "bench"))
    runner = ChatRunner(pool, RlmTask(inputs={}), ChatOptions())
    engine = LiteLLMEngine(api_key="unused", api_base=fake.base_url, wire_model=MODEL)
    plain = dspy.LM(MODEL, engine=engine, cache=False, num_retries=0)
    adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)
    cot = dspy.ChainOfThought(ChatTurn)

    def bare() -> object:
        with dspy.context(lm=plain, adapter=adapter):
            return cot(
                question="What is two plus two?", history=dspy.History(messages=[]), core_memory=""
            )

    async def baseline() -> None:
        await asyncio.to_thread(bare)

    async def project() -> None:
        await runner.run(turns.pop(), CancelToken())

    base, proj = await side_by_side(
        baseline, project, samples=samples, warmup=5, block=max(5, samples // 10)
    )
    title = (
        f"a one-call CoT turn, model latency {latency * 1000:.0f} ms: ChatRunner vs the same "
        "ChainOfThought on a plain dspy.LM"
    )
    goal = "overhead <= 25 ms per turn" if latency == 0 else "<= 1.15x"
    report(title, base, proj, goal=goal, unit="turn")
    print(f"   overhead per turn p50 {proj.p50_ms - base.p50_ms:.2f} ms", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few samples (CI smoke run)")
    parser.add_argument("--latency-ms", type=float, default=100.0)
    args = parser.parse_args()
    asyncio.run(main(20 if args.quick else 100, args.latency_ms / 1000))
