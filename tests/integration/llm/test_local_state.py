"""The embedded model's state as `fleet up` stores it, read where a person looks: `/ready`'s
`llm` component (the gateway's readiness check), the agent's model probe (`agent.test_lm`'s
`local_model` check) and `fleet doctor`'s rows. A server of its own per test (the state is a
global key). The model server is the scripted LM (a FAKE) standing at the state's address."""

import asyncio
import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import msgspec
from nats.aio.client import Client
from nats.js.kv import KeyValue

from fleet_agent.profiles import LlmStores, test_lm
from fleet_cli.commands.doctor import component_rows, last_local_state
from fleet_cli.localllm.state import StateReporter
from fleet_events import new_id, streams, utc_now
from fleet_events.llm import LOCAL_MODEL_KEY, LlmProfile, LocalModelState, TestLm
from fleet_gateway.readiness import Component, check
from fleet_harness.scripted_lm import ScriptedLM
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer, free_port
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader, ensure_keypair, load_private_key


async def bucket(nats: NatsServer) -> tuple[Client, KeyValue]:
    nc = await connect(nats.url, name="test")
    await bootstrap(nc.jetstream(), env={})
    return nc, await nc.jetstream().key_value(streams.CONFIG.bucket)


async def store(kv: KeyValue, **fields: object) -> LocalModelState:
    state = LocalModelState(
        **{"model": "qwen2.5-coder-0.5b-instruct", "updated_at": utc_now(), **fields}  # type: ignore[arg-type]
    )
    await kv.put(LOCAL_MODEL_KEY, msgspec.json.encode(state))
    return state


# The readiness probes' deadline. Only the "up" case waits on it (the KV read and the model
# server's answer must both come within it); every "down" case here is decided at once (a
# refused connection, a state that is not up), so a wide bound costs nothing when it passes.
PROBE_S = 10.0


async def llm_component(nc: Client) -> Component | None:
    ready = await check(nc, (), timeout=PROBE_S)
    found = [c for c in ready.components if c.name == "llm"]
    return found[0] if found else None


async def test_ready_lists_the_local_model_only_when_a_mesh_runs_one(
    private_nats: NatsServer,
) -> None:
    nc, kv = await bucket(private_nats)
    try:
        assert await llm_component(nc) is None  # --llm none, or a remote model: not listed
        await store(kv, state="building", detail="building the server: 40s so far", eta_s=500)
        building = await llm_component(nc)
        assert building is not None
        assert (building.kind, building.state) == ("llm", "starting")
        assert "building: qwen2.5-coder-0.5b-instruct, ~9 min left (building the server: 40s" in (
            building.detail
        )
        ready = await check(nc, (), timeout=PROBE_S)
        assert ready.ready  # the mesh serves while the model installs: a turn waits for it
        assert ready.starting == ["llm"]
        await store(kv, state="failed", detail="cmake is missing: apt-get install cmake",
                    advice="fix what the error names and start fleet up again")  # fmt: skip
        failed = await llm_component(nc)
        assert failed is not None
        assert "apt-get install cmake" in failed.detail
        assert "start fleet up again" in failed.detail
    finally:
        await nc.close()


async def test_an_up_model_is_up_with_its_speed_only_while_its_server_answers(
    private_nats: NatsServer,
) -> None:
    nc, kv = await bucket(private_nats)
    try:
        with ScriptedLM(["OK"]) as fake:
            await store(kv, state="up", api_base=fake.base_url, first_token_ms=412.0,
                        tokens_per_s=24.5)  # fmt: skip
            up = await llm_component(nc)
        assert up is not None
        assert up.state == "up", up.detail
        assert "first token 412 ms, 24.5 tokens/s" in up.detail
        # the server went away (a crash between restarts): the stored "up" is not believed
        await store(kv, state="up", api_base=f"http://127.0.0.1:{free_port()}/v1")
        gone = await llm_component(nc)
        assert gone is not None
        assert gone.state == "down"
        assert "does not answer now" in gone.detail
        assert "logs/llm.log" in gone.detail
        # an address that is not loopback is never probed from the gateway
        await store(kv, state="up", api_base="http://10.1.2.3:8181/v1")
        elsewhere = await llm_component(nc)
        assert elsewhere is not None
        assert elsewhere.state == "down"
    finally:
        await nc.close()


async def test_the_model_probe_reports_the_local_models_state_and_speed(
    private_nats: NatsServer, tmp_path: Path
) -> None:
    nc, kv = await bucket(private_nats)
    js = nc.jetstream()
    key = load_private_key(ensure_keypair(tmp_path / "secrets").private)
    stores = LlmStores(
        llm=await LlmConfig.open(js), secrets=await SecretsReader.open_reader(js, key), config=kv
    )
    tenant = f"t{new_id()[:10]}"
    try:
        with ScriptedLM(["OK", "OK"]) as fake:
            profile = LlmProfile(name="default", model="openai/scripted", api_base=fake.base_url)
            await stores.llm.put_profile(profile, tenant=tenant)
            await stores.llm.set_role("planner", "default", tenant=tenant)
            await store(kv, state="up", api_base=fake.base_url, first_token_ms=380.0,
                        tokens_per_s=25.0)  # fmt: skip
            up = await test_lm(stores, TestLm(tenant=tenant))
            await store(kv, state="loading", api_base=fake.base_url)
            loading = await test_lm(stores, TestLm(tenant=tenant))
            calls = len(fake.requests)
    finally:
        await nc.close()
    (local,) = [c for c in up.checks if c.name == "local_model"]
    assert local.ok
    assert "first token 380 ms, 25.0 tokens/s" in local.detail
    assert up.ok
    (local,) = [c for c in loading.checks if c.name == "local_model"]
    assert not local.ok
    assert not loading.ok
    assert not loading.preflight_ok
    assert any("not up yet" in g for g in loading.guidance)
    assert calls == 1  # a model that is loading is not asked


def test_a_stopped_meshs_model_is_never_reported_up_from_its_state_file(tmp_path: Path) -> None:
    """`fleet up` wrote "up" and then stopped (or was killed): the file still says up, but the
    model stopped with its mesh. Only while that mesh runs may the file's "up" be believed."""

    async def write() -> None:
        reporter = StateReporter(tmp_path / "llm", None, asyncio.get_running_loop())
        reporter.report("up", "listening on 127.0.0.1:8181")

    asyncio.run(write())
    ((name, up, detail, advice),) = last_local_state(tmp_path / "llm", mesh_runs=False)
    assert (name, up) == ("llm", False)
    assert detail.startswith("stopped with its mesh (was up")
    assert "start the mesh again" in advice
    ((_, up_while_running, _, _),) = last_local_state(tmp_path / "llm", mesh_runs=True)
    assert up_while_running


def test_fleet_doctor_reads_the_state_fleet_up_left_when_no_gateway_answers(
    tmp_path: Path,
) -> None:
    async def write() -> None:
        reporter = StateReporter(tmp_path / "llm", None, asyncio.get_running_loop())
        reporter.report("failed", "g++ is missing: apt-get install g++", advice="install it")

    asyncio.run(write())
    ((name, up, detail, advice),) = last_local_state(tmp_path / "llm", mesh_runs=False)
    assert (name, up) == ("llm", False)
    assert "failed" in detail
    assert "apt-get install g++" in detail
    assert advice == "install it"
    assert last_local_state(tmp_path / "nothing", mesh_runs=False) == []
    rows = component_rows([{"name": "llm", "kind": "llm", "state": "down", "detail": "x"}])
    llm_advice = next(r[3] for r in rows if r[0] == "llm")
    assert "--llm none" in llm_advice
    assert "logs/llm.log" in llm_advice
