"""`/api/v1/info`, `/api/v1/runtime/status` and `/api/v1/runtime/tests/lm` on a real
nats-server, answered by the agent's own verbs (`register_agent_verbs`, the code the agent's
setup runs) against the scripted LM (a FAKE model server). Each tenant sees only its own
roles and probes only its own profiles; a key the probe used appears in no response and no
log line."""

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_agent.profiles import LlmStores, register_agent_verbs
from fleet_events.llm import LlmProfile
from fleet_harness.scripted_lm import Reply, ScriptedLM
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader, ensure_keypair, load_private_key
from fleet_mesh.service import ServiceContext

from .api_kit import Api, running_api, tenant_id

PLANTED = "sk-planted-" + "4e5d6c" * 6


@pytest.fixture
async def stores(js: JetStreamContext, tmp_path: Path) -> LlmStores:
    key = load_private_key(ensure_keypair(tmp_path / "secrets").private)
    return LlmStores(llm=await LlmConfig.open(js), secrets=await SecretsReader.open_reader(js, key))


@pytest.fixture
async def agent(nc: Client, js: JetStreamContext, stores: LlmStores) -> AsyncIterator[str]:
    replica = "agent-runtime-test"
    ctx = ServiceContext(name="agent", replica=replica, nc=nc, js=js, log=logging.getLogger("a"))
    await register_agent_verbs(ctx, stores)
    yield replica
    for served in ctx.served:
        await served.stop()


@pytest.fixture
async def api(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(nats_server.url, tmp_path / "gw") as running:
        yield running


async def _bind(stores: LlmStores, tenant: str, **fields: object) -> None:
    profile = LlmProfile(**{"name": "main", **fields})  # type: ignore[arg-type]
    await stores.llm.put_profile(profile, tenant=tenant)
    for role in ("planner", "delegate"):
        await stores.llm.set_role(role, "main", tenant=tenant)


async def test_info_names_the_gateway_and_the_caller(api: Api) -> None:
    tenant = tenant_id()
    response = await api.call("GET", "/api/v1/info", tenant, user="bob")
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["service"], body["api"], body["replica"]) == ("fleet-rlm", "v1", api.state.replica)
    assert body["caller"] == {"tenant": tenant, "user": "bob", "admin": False}
    assert (await api.client.get("/api/v1/info")).status_code == 401


async def test_status_shows_the_tenants_own_roles_and_what_is_missing(
    api: Api, stores: LlmStores, agent: str
) -> None:
    mine, other = tenant_id(), tenant_id()
    await _bind(stores, mine, model="openai/scripted", api_base="http://127.0.0.1:9/v1", secret="k")
    response = await api.call("GET", "/api/v1/runtime/status", mine)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["agent_replica"] == agent
    planner = {r["role"]: r for r in body["roles"]}["planner"]
    assert (planner["profile"], planner["model"]) == ("main", "openai/scripted")
    assert (planner["has_api_key"], planner["api_key_found"]) == (True, False)
    assert "secret 'k' is not stored" in planner["problem"]
    assert body["llm_ready"] is False
    assert body["ready"] is False
    assert any(c["name"] == "nats" and c["state"] == "up" for c in body["components"])

    theirs = (await api.call("GET", "/api/v1/runtime/status", other)).json()
    assert all(r["profile"] != "main" for r in theirs["roles"]), "another tenant's profile shown"

    await stores.secrets.put("k", PLANTED, tenant=mine)
    fixed = await api.call("GET", "/api/v1/runtime/status", mine)
    assert fixed.json()["llm_ready"] is True
    assert PLANTED not in fixed.text


async def test_a_global_profiles_address_is_shown_to_admins_only(
    api: Api, stores: LlmStores, agent: str
) -> None:
    # every tenant saw the operator's api_base (the embedded server, an internal proxy)
    tenant = tenant_id()
    internal = "http://10.1.2.3:8080/v1"
    profile = LlmProfile(name=f"ops{tenant}", model="openai/scripted", api_base=internal)
    await stores.llm.put_profile(profile, tenant=None)
    for role in ("planner", "delegate"):
        await stores.llm.set_role(role, profile.name, tenant=tenant)
    seen = await api.call("GET", "/api/v1/runtime/status", tenant)
    assert seen.status_code == 200, seen.text
    planner = {r["role"]: r for r in seen.json()["roles"]}["planner"]
    assert (planner["profile"], planner["model"], planner["api_base"]) == (
        profile.name, "openai/scripted", None,
    )  # fmt: skip
    assert internal not in seen.text
    admin = {"Authorization": f"Bearer {api.token(tenant, admin=True)}"}
    full = await api.client.get("/api/v1/runtime/status", headers=admin)
    assert {r["role"]: r for r in full.json()["roles"]}["planner"]["api_base"] == internal
    # the tenant's own profile's address is the tenant's: shown to it
    await _bind(stores, tenant, model="openai/scripted", api_base="http://127.0.0.1:9/v1")
    own = (await api.call("GET", "/api/v1/runtime/status", tenant)).json()
    assert {r["role"]: r for r in own["roles"]}["planner"]["api_base"] == "http://127.0.0.1:9/v1"


async def test_the_lm_probe_runs_on_the_tenants_profile_and_never_shows_its_key(
    api: Api, stores: LlmStores, agent: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mine, other = tenant_id(), tenant_id()
    with ScriptedLM(["OK"], api_key=PLANTED) as fake:
        await stores.secrets.put("key", PLANTED, tenant=mine)
        await _bind(stores, mine, model="openai/scripted", api_base=fake.base_url, secret="key")
        response = await api.call("POST", "/api/v1/runtime/tests/lm", mine, json={})
        assert len(fake.requests) == 1
        theirs = await api.call("POST", "/api/v1/runtime/tests/lm", other, json={"role": "planner"})
        assert len(fake.requests) == 1, "another tenant's probe reached this tenant's model"
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["ok"], body["preflight_ok"], body["error"]) == (True, True, "")
    assert [(c["name"], c["ok"]) for c in body["checks"]] == [
        ("model_set", True),
        ("api_key_set", True),
    ]
    assert body["output_preview"] == "OK"
    assert body["latency_ms"] > 0
    assert (body["profile"], body["model"]) == ("main", "openai/scripted")
    assert {"guidance", "checked_at", "kind"} <= set(body)

    assert theirs.status_code == 200, theirs.text
    assert (theirs.json()["ok"], theirs.json()["preflight_ok"]) == (False, False)
    for text in (response.text, theirs.text, caplog.text):
        assert PLANTED not in text


async def test_a_failed_probe_says_its_kind_never_the_peers_body(
    api: Api, stores: LlmStores, agent: str
) -> None:
    # a tenant's api_base may point at anything the agent reaches: its answer's body (and a
    # Python traceback) came back in the probe's error
    mine = tenant_id()
    inside = "INTERNAL-ADMIN-PAGE: db password hunter2"
    with ScriptedLM([Reply(inside, status=500)]) as fake:
        await _bind(stores, mine, model="openai/scripted", api_base=fake.base_url)
        response = await api.call("POST", "/api/v1/runtime/tests/lm", mine, json={})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ok"] is False
    assert body["error"].startswith("llm_unavailable: ")
    assert "HTTP 500" in body["error"]
    assert inside not in response.text
    assert "Traceback" not in response.text
    assert body["guidance"] == [
        "the model server failed: check the address, the key and the model name"
    ]


async def test_a_bad_probe_request_names_the_field_and_its_allowed_values(
    api: Api, agent: str
) -> None:
    tenant = tenant_id()
    response = await api.call("POST", "/api/v1/runtime/tests/lm", tenant, json={"role": "boss"})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "invalid_request", body
    text = response.text
    assert "role" in text
    assert "planner" in text
    assert "'boss'" in text


async def test_without_an_agent_the_probe_is_503_and_status_says_so(tmp_path: Path) -> None:
    # a server of its own: on the shared one another test's agent may be answering
    server = NatsServer(store_dir=tmp_path / "store", log_path=tmp_path / "nats.log").start()
    try:
        nc = await connect(server.url, name="test")
        await bootstrap(nc.jetstream())
        await nc.close()
        async with running_api(server.url, tmp_path / "gw") as api:
            tenant = tenant_id()
            probe = await api.call("POST", "/api/v1/runtime/tests/lm", tenant, json={})
            assert probe.status_code == 503, probe.text
            assert probe.json()["code"] == "agent_unavailable"
            assert "start one" in probe.json()["message"]
            status = await api.call("GET", "/api/v1/runtime/status", tenant)
            assert status.status_code == 200, status.text
            assert (status.json()["llm_ready"], status.json()["agent_replica"]) == (False, None)
            assert "no agent is running" in status.json()["guidance"][0]
    finally:
        server.stop()


async def test_a_profiles_own_test_probes_that_profile_in_the_callers_tenant_only(
    api: Api, stores: LlmStores, agent: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mine, other = tenant_id(), tenant_id()
    with ScriptedLM(["OK"], api_key=PLANTED) as fake:
        await stores.secrets.put("key", PLANTED, tenant=mine)
        # bound to no role: the probe tests the named profile, not the planner's
        profile = LlmProfile(name="spare", model="openai/scripted", api_base=fake.base_url,
                             secret="key")  # fmt: skip
        await stores.llm.put_profile(profile, tenant=mine)
        response = await api.call("POST", "/api/v1/runtime/llm-profiles/spare/test", mine)
        assert len(fake.requests) == 1
        theirs = await api.call("POST", "/api/v1/runtime/llm-profiles/spare/test", other, json={})
        missing = await api.call("POST", "/api/v1/runtime/llm-profiles/nope/test", mine, json={})
        assert len(fake.requests) == 1, "a refused probe reached the model"
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["ok"], body["profile"], body["output_preview"]) == (True, "spare", "OK")
    assert (theirs.status_code, theirs.json()["code"]) == (404, "llm_profile_not_found")
    assert (missing.status_code, missing.json()["code"]) == (404, "llm_profile_not_found")
    bad = await api.call(
        "POST", "/api/v1/runtime/llm-profiles/spare/test", mine, json={"timeout_s": 0}
    )
    assert bad.status_code == 422
    assert "timeout_s" in bad.json()["message"]
    for text in (response.text, caplog.text):
        assert PLANTED not in text
