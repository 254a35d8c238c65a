"""`agent.status` and `agent.test_lm` served on a real bus, as the agent's setup serves them,
against the scripted LM (a FAKE model server)."""

import logging
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_agent.profiles import LlmStores, open_stores, register_agent_verbs
from fleet_events import bus, new_id
from fleet_events.llm import GetAgentStatus, LlmProfile, TestLm
from fleet_harness.scripted_lm import Reply, ScriptedLM
from fleet_mesh import rpc
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretError, SecretsReader, ensure_keypair, load_private_key
from fleet_mesh.service import ServiceContext

PLANTED = "sk-planted-" + "9b8a7c" * 6


@pytest.fixture
async def stores(js: JetStreamContext, tmp_path: Path) -> LlmStores:
    key = load_private_key(ensure_keypair(tmp_path / "secrets").private)
    return LlmStores(llm=await LlmConfig.open(js), secrets=await SecretsReader.open_reader(js, key))


@pytest.fixture
async def served(nc: Client, js: JetStreamContext, stores: LlmStores) -> AsyncIterator[None]:
    ctx = ServiceContext(
        name="agent", replica="agent-test-0", nc=nc, js=js, log=logging.getLogger("agent")
    )
    await register_agent_verbs(ctx, stores)
    yield
    for served in ctx.served:
        await served.stop()


async def bind(stores: LlmStores, tenant: str, **fields: object) -> LlmProfile:
    profile = LlmProfile(**{"name": "main", **fields})  # type: ignore[arg-type]
    await stores.llm.put_profile(profile, tenant=tenant)
    for role in ("planner", "delegate"):
        await stores.llm.set_role(role, "main", tenant=tenant)
    return profile


async def probe(nc: Client, request: TestLm) -> object:
    return await rpc.call_verb(nc, bus.TEST_LM, request, timeout=30)


async def test_the_probe_passes_on_a_model_that_answers_ok(
    nc: Client, stores: LlmStores, served: None
) -> None:
    tenant = f"t-{new_id()[:10]}"
    with ScriptedLM(["OK"], api_key=PLANTED) as fake:
        await stores.secrets.put("key", PLANTED, tenant=tenant)
        await bind(stores, tenant, model="openai/scripted", api_base=fake.base_url, secret="key")
        result = await rpc.call_verb(nc, bus.TEST_LM, TestLm(tenant=tenant), timeout=30)
        assert fake.requests[0].last_user == "Reply with exactly OK"
    assert (result.ok, result.preflight_ok, result.error) == (True, True, "")
    assert [(c.name, c.ok) for c in result.checks] == [("model_set", True), ("api_key_set", True)]
    assert result.output_preview == "OK"
    assert result.latency_ms is not None
    assert result.latency_ms > 0
    assert (result.kind, result.profile, result.model) == ("lm", "main", "openai/scripted")
    assert PLANTED not in msgspec.json.encode(result).decode()


async def test_the_probe_says_what_is_missing(nc: Client, stores: LlmStores, served: None) -> None:
    tenant = f"t-{new_id()[:10]}"
    unknown = TestLm(tenant=tenant, profile="no-such-profile")
    nothing = await rpc.call_verb(nc, bus.TEST_LM, unknown, timeout=30)
    assert (nothing.ok, nothing.preflight_ok) == (False, False)
    assert nothing.checks[0].name == "model_set"
    assert "no LLM profile 'no-such-profile'" in nothing.checks[0].detail

    await bind(
        stores, tenant, model="openai/scripted", api_base="http://127.0.0.1:9/v1", secret="gone"
    )
    missing = await rpc.call_verb(nc, bus.TEST_LM, TestLm(tenant=tenant), timeout=30)
    assert (missing.ok, missing.preflight_ok) == (False, False)
    assert missing.checks[1].name == "api_key_set"
    assert "secret 'gone' is not stored in tenant" in missing.checks[1].detail
    assert any("store the secret 'gone'" in g for g in missing.guidance)


async def test_a_wrong_answer_and_a_dead_server_are_told_apart(
    nc: Client, stores: LlmStores, served: None
) -> None:
    tenant = f"t-{new_id()[:10]}"
    with ScriptedLM(["Sure! Here is OK for you."]) as fake:
        await bind(stores, tenant, model="openai/scripted", api_base=fake.base_url)
        chatty = await rpc.call_verb(nc, bus.TEST_LM, TestLm(tenant=tenant), timeout=30)
    assert (chatty.ok, chatty.preflight_ok, chatty.error) == (False, True, "")
    assert chatty.output_preview == "Sure! Here is OK for you."
    assert any("not with exactly OK" in g for g in chatty.guidance)

    echo = Reply(f"Incorrect API key provided: {PLANTED}", status=401)
    with ScriptedLM([echo]) as fake:
        await stores.secrets.put("key", PLANTED, tenant=tenant)
        await bind(stores, tenant, model="openai/scripted", api_base=fake.base_url, secret="key")
        refused = await rpc.call_verb(nc, bus.TEST_LM, TestLm(tenant=tenant), timeout=30)
    assert (refused.ok, refused.preflight_ok) == (False, True)
    # the failure by its kind, never the peer's body (which here echoes the key, and from a
    # tenant's api_base could be any internal page): issue 27, M2
    assert refused.error.startswith("llm_auth_failed: the provider refused the key")
    assert "Incorrect API key provided" not in refused.error
    assert PLANTED not in msgspec.json.encode(refused).decode()
    assert refused.guidance == [
        "the server refused the key: store the right secret for the profile"
    ]


async def test_status_names_each_roles_profile_and_problem(
    nc: Client, stores: LlmStores, served: None
) -> None:
    tenant = f"t-{new_id()[:10]}"
    await bind(
        stores, tenant, model="openai/scripted", api_base="http://127.0.0.1:9/v1", secret="k"
    )
    status = await rpc.call_verb(nc, bus.AGENT_STATUS, GetAgentStatus(tenant=tenant), timeout=10)
    by_role = {r.role: r for r in status.roles}
    assert set(by_role) == {"planner", "delegate", "delegate_small", "reflection"}
    planner = by_role["planner"]
    assert (planner.profile, planner.model, planner.has_secret) == ("main", "openai/scripted", True)
    assert not planner.secret_found
    assert "secret 'k' is not stored" in planner.problem
    assert not status.ready
    assert status.replica == "agent-test-0"

    await stores.secrets.put("k", PLANTED, tenant=tenant)
    fixed = await rpc.call_verb(nc, bus.AGENT_STATUS, GetAgentStatus(tenant=tenant), timeout=10)
    assert fixed.ready
    assert {r.role: r.secret_found for r in fixed.roles}["planner"]
    assert PLANTED not in msgspec.json.encode(fixed).decode()


async def test_malformed_requests_are_refused_and_name_the_value(nc: Client, served: None) -> None:
    with pytest.raises(rpc.RemoteError, match=re.escape("bad_request: invalid tenant id 'a.b'")):
        await rpc.call_verb(nc, bus.AGENT_STATUS, GetAgentStatus(tenant="a.b"), timeout=10)
    with pytest.raises(rpc.RemoteError, match="unknown LLM role 'boss'"):
        await probe(nc, TestLm(tenant="acme", role="boss"))
    with pytest.raises(rpc.RemoteError, match=re.escape("timeout_s cannot be 0.0")):
        await probe(nc, TestLm(tenant="acme", timeout_s=0.0))


async def test_the_stores_come_from_the_services_key_file(
    nc: Client, js: JetStreamContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = ServiceContext(name="agent", replica="r", nc=nc, js=js, log=logging.getLogger("a"))
    monkeypatch.delenv("FLEET_SECRETS_KEY", raising=False)
    with pytest.raises(SecretError, match="set FLEET_SECRETS_KEY to its file"):
        await open_stores(ctx)
    files = ensure_keypair(tmp_path / "k")
    monkeypatch.setenv("FLEET_SECRETS_KEY", str(files.private))
    stores = await open_stores(ctx)
    tenant = f"t-{new_id()[:10]}"
    await stores.secrets.put("s", PLANTED, tenant=tenant)
    assert await stores.secrets.get("s", tenant=tenant) == PLANTED
