"""Budget-aware LM benchmark: one call through `fleet_agent.lm.budgeted_lm` beside the same call
through a plain `dspy.LM`, both against the scripted LM (a FAKE model server) on loopback.

The difference is what the budget costs each model call: the profile and key lookups (two KV
gets and a sealed-box open), a `budget.grant` and a `budget.usage` round trip to a real budget
replica, each a durable ledger append. Printed at zero model latency (the overhead itself, per
call) and at a fixed latency that stands in for a fast real model (the ratio a user feels).

Run: `.venv/bin/python bench/lm.py [--quick]`. Starts its own nats-server, bootstrap, one budget
replica and the fake.
"""

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# the bench's model server is a fake on loopback, and a tenant's profile may reach public
# addresses only: this bench deployment allows loopback, as the suite does (conftest.py)
os.environ.setdefault("FLEET_EGRESS_ALLOW", "127.0.0.0/8")

import dspy
from dspy.clients.engines.litellm_engine import LiteLLMEngine

from fleet_agent.lm import CallScope, LmServices, budgeted_lm
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus, new_id
from fleet_events.budget import OpenTree
from fleet_events.bus import Ping
from fleet_events.llm import LlmProfile, Prices
from fleet_harness.bench import report, side_by_side
from fleet_harness.procs import Launcher
from fleet_harness.scripted_lm import ScriptedLM
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader, ensure_keypair, load_private_key

KEY = "bench-key-0123456789"
MODEL = "openai/scripted"


def answer(_: object) -> str:
    return "an answer of a few words"


async def wait_budget(url: str) -> None:
    nc = await connect(url, name="bench-wait")
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                pong = await rpc.call_verb(nc, bus.ping("budget"), Ping(), timeout=0.5)
                if "concurrency" in pong.details:
                    return
            except Exception:  # noqa: S110 - starting up: no responders yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the budget replica never answered")
            await asyncio.sleep(0.05)
    finally:
        await nc.close()


async def main(samples: int, latency_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = NatsServer(store_dir=root / "nats", log_path=root / "nats.log").start()
        launcher = Launcher(nats_url=server.url, log_dir=root)
        try:
            nc = await connect(server.url, name="bench-bootstrap")
            await bootstrap(nc.jetstream(), env={})
            await nc.close()
            launcher.start("budget")
            await wait_budget(server.url)
            private = load_private_key(ensure_keypair(root / "secrets").private)
            for latency in (0.0, latency_s):
                with ScriptedLM(answer, api_key=KEY, latency_s=latency) as fake:
                    await run_pair(server.url, fake, private, samples, latency)
        finally:
            launcher.stop_all()
            server.stop()


async def run_pair(
    url: str, fake: ScriptedLM, private: object, samples: int, latency: float
) -> None:
    with SandboxBus(url, tenant="bench", name="bench-lm") as line:
        js = line.nc.jetstream()
        services = LmServices(
            nc=line.nc,
            llm=line.run(LlmConfig.open(js), timeout=10),
            secrets=line.run(SecretsReader.open_reader(js, private), timeout=10),  # type: ignore[arg-type]
        )
        line.run(services.secrets.put("k", KEY, tenant="bench"), timeout=10)
        profile = LlmProfile(
            name="bench",
            model=MODEL,
            api_base=fake.base_url,
            secret="k",  # noqa: S106 - the name of a secret, not a key
            prices=Prices(input_per_mtok=1.0, output_per_mtok=2.0),
        )
        line.run(services.llm.put_profile(profile, tenant="bench"), timeout=10)
        line.run(services.llm.set_role("planner", "bench", tenant="bench"), timeout=10)
        tree = new_id()
        request = OpenTree(request_id=new_id(), tenant="bench", tree=tree, max_llm_calls=10**7)
        line.call(bus.OPEN_TREE, request, timeout=5)
        scope = CallScope(tenant="bench", tree=tree, run=new_id(), role="planner", kind="sub")
        budgeted = budgeted_lm(line, services, scope)
        # the same transport as the budgeted LM (LiteLLM), so the difference is the budget
        same_transport = LiteLLMEngine(api_key=KEY, api_base=fake.base_url, wire_model=MODEL)
        plain = dspy.LM(MODEL, engine=same_transport, cache=False, num_retries=0)
        native = dspy.LM(MODEL, api_base=fake.base_url, api_key=KEY, cache=False, num_retries=0)

        async def baseline() -> None:
            await asyncio.to_thread(plain, "one question")

        async def project() -> None:
            await asyncio.to_thread(budgeted, "one question")

        base, proj = await side_by_side(
            baseline, project, samples=samples, warmup=5, block=max(5, samples // 10)
        )
        title = (
            f"one LM call, model latency {latency * 1000:.0f} ms: budgeted LM vs the same call "
            "through a plain dspy.LM on LiteLLM"
        )
        goal = "overhead <= 10 ms per call" if latency == 0 else "<= 1.15x"
        report(title, base, proj, goal=goal)
        print(f"   overhead per call p50 {proj.p50_ms - base.p50_ms:.2f} ms", flush=True)
        if latency == 0:

            async def direct() -> None:
                await asyncio.to_thread(native, "one question")

            lite, nat = await side_by_side(baseline, direct, samples=samples, warmup=5)
            report(
                "for reference: dspy's native engine vs LiteLLM for the same call (no budget)",
                lite,
                nat,
                goal="none: what LiteLLM itself costs per call",
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few samples (CI smoke run)")
    parser.add_argument("--latency-ms", type=float, default=100.0)
    args = parser.parse_args()
    asyncio.run(main(20 if args.quick else 200, args.latency_ms / 1000))
