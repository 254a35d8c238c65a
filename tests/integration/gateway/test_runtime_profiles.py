"""`/api/v1/runtime/llm-profiles` on a real nats-server: a key sent with a profile is sealed
into the secrets store (the gateway holds only the public key), the agent's own probe opens it
and reaches the scripted LM (a FAKE model server) with it, and the key appears in no response,
no log line and no revision of the config KV. Another tenant sees none of it."""

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from fleet_agent.profiles import LlmStores, register_agent_verbs
from fleet_events import llm as lm
from fleet_events import streams
from fleet_harness.scripted_lm import ScriptedLM
from fleet_mesh import kvscan
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader, ensure_keypair, load_private_key, secret_key
from fleet_mesh.service import ServiceContext

from .api_kit import Api, running_api, tenant_id

PLANTED = "sk-planted-" + "7a1b2c" * 6
ROTATED = "sk-rotated-" + "0f9e8d" * 6
BASE = "/api/v1/runtime/llm-profiles"


@pytest.fixture
async def api(
    nats_server: NatsServer,
    nc: Client,
    js: JetStreamContext,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Api]:
    keys = ensure_keypair(tmp_path / "secrets")
    monkeypatch.setenv("FLEET_SECRETS_PUBLIC_KEY", str(keys.public))
    monkeypatch.delenv("FLEET_SECRETS_KEY", raising=False)  # the gateway never holds it
    stores = LlmStores(
        llm=await LlmConfig.open(js),
        secrets=await SecretsReader.open_reader(js, load_private_key(keys.private)),
    )
    ctx = ServiceContext(name="agent", replica="agent-prof", nc=nc, js=js, log=logging.getLogger())
    await register_agent_verbs(ctx, stores)
    async with running_api(nats_server.url, tmp_path / "gw") as running:
        yield running
    for served in ctx.served:
        await served.stop()


async def _history(js: JetStreamContext, bucket: str, key: str) -> list[bytes]:
    return [entry.value for entry in await kvscan.history(js, bucket, key)]


async def test_a_profiles_key_is_sealed_used_rotated_and_never_shown(
    api: Api, js: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    mine, other = tenant_id(), tenant_id()
    texts: list[str] = []
    with ScriptedLM(["OK", "OK"], api_key=PLANTED) as fake:
        created = await api.call("POST", BASE, mine, json={
            "name": "main", "model": "openai/scripted", "api_base": fake.base_url,
            "api_key": PLANTED,
        })  # fmt: skip
        texts.append(created.text)
        assert created.status_code == 201, created.text
        body = created.json()
        assert (body["name"], body["has_api_key"]) == ("main", True)
        assert "api_key" not in body
        assert "secret" not in body

        probe = await api.call("POST", "/api/v1/runtime/tests/lm", mine, json={"profile": "main"})
        texts.append(probe.text)
        assert probe.status_code == 200, probe.text
        assert (probe.json()["ok"], probe.json()["error"]) == (True, ""), probe.text
        assert fake.requests, "the sealed key did not reach the model through the agent"

        listed = await api.call("GET", BASE, mine)
        got = await api.call("GET", f"{BASE}/main", mine)
        texts += [listed.text, got.text]
        assert [p["name"] for p in listed.json()["items"]] == ["main"]
        assert got.json()["has_api_key"] is True

    theirs = await api.call("GET", f"{BASE}/main", other)
    assert theirs.status_code == 404, theirs.text
    assert (await api.call("GET", BASE, other)).json()["items"] == []
    assert (await api.call("DELETE", f"{BASE}/main", other)).status_code == 404

    with ScriptedLM(["OK"], api_key=ROTATED) as fake:
        rotated = await api.call("PATCH", f"{BASE}/main", mine, json={
            "api_key": ROTATED, "api_base": fake.base_url,
        })  # fmt: skip
        texts.append(rotated.text)
        assert rotated.status_code == 200, rotated.text
        assert rotated.json()["revision"] > body["revision"]
        again = await api.call("POST", "/api/v1/runtime/tests/lm", mine, json={"profile": "main"})
        texts.append(again.text)
        assert again.json()["ok"] is True, again.text

    config = await _history(js, streams.CONFIG.bucket, lm.profile_key("main", mine))
    sealed = await _history(js, streams.SECRETS.bucket, secret_key("llm-main", mine))
    assert len(config) >= 2
    assert sealed  # the secrets bucket keeps one revision: the rotated value, sealed
    for key in (PLANTED, ROTATED):
        for text in [*texts, caplog.text]:
            assert key not in text
        for value in config + sealed:
            assert key.encode() not in value

    deleted = await api.call("DELETE", f"{BASE}/main", mine)
    assert deleted.status_code == 200, deleted.text
    assert (await api.call("GET", f"{BASE}/main", mine)).status_code == 404


async def test_bad_profiles_are_refused_naming_the_value_and_store_nothing(
    api: Api, js: JetStreamContext
) -> None:
    tenant = tenant_id()
    for body, named in (
        ({"name": "a.b", "model": "m"}, "'a.b'"),
        ({"name": "ok", "model": "has space"}, "'has space'"),
        ({"name": "ok", "model": "m", "api_base": "file:///etc/passwd"}, "file:///etc/passwd"),
        ({"name": "ok", "model": "m", "temprature": 0.2}, "'temprature'"),  # misspelt: not lost
    ):
        response = await api.call("POST", BASE, tenant, json={**body, "api_key": PLANTED})
        assert response.status_code == 422, response.text
        assert named in response.text
        assert PLANTED not in response.text
    secrets = await js.key_value(streams.SECRETS.bucket)
    with pytest.raises(KeyNotFoundError):
        await secrets.get(secret_key("llm-ok", tenant))
    assert (await api.call("GET", BASE, tenant)).json()["items"] == []

    await api.call("POST", BASE, tenant, json={"name": "dup", "model": "m"})
    again = await api.call("POST", BASE, tenant, json={"name": "dup", "model": "m"})
    assert again.status_code == 409, again.text
    assert again.json()["code"] == "llm_profile_exists"


async def test_roles_bind_the_tenants_profiles_and_refuse_unknown_ones(
    api: Api, js: JetStreamContext
) -> None:
    mine, other = tenant_id(), tenant_id()
    created = await api.call("POST", BASE, mine, json={"name": "fast", "model": "openai/m"})
    assert created.status_code == 201, created.text

    bad = await api.call(
        "PATCH", "/api/v1/runtime/llm-roles", mine,
        json={"roles": {"planner": "fast", "delegate": "no-such"}},
    )  # fmt: skip
    assert bad.status_code == 422, bad.text
    assert bad.json()["code"] == "invalid_llm_role"
    assert "'delegate'" in bad.json()["message"]
    assert "'no-such'" in bad.json()["message"]
    config = await js.key_value(streams.CONFIG.bucket)
    with pytest.raises(KeyNotFoundError):
        await config.get(lm.role_key("planner", mine))  # nothing of the refused patch stored

    unknown_role = await api.call(
        "PATCH", "/api/v1/runtime/llm-roles", mine, json={"roles": {"boss": "fast"}}
    )
    assert unknown_role.status_code == 422, unknown_role.text
    assert "planner" in unknown_role.text

    ok = await api.call(
        "PATCH", "/api/v1/runtime/llm-roles", mine, json={"roles": {"planner": "fast"}}
    )
    assert ok.status_code == 200, ok.text
    planner = {b["role"]: b for b in ok.json()["items"]}["planner"]
    assert (planner["profile"], planner["scope"]) == ("fast", "tenant")

    theirs = await api.call("GET", "/api/v1/runtime/llm-roles", other)
    their_planner = {b["role"]: b for b in theirs.json()["items"]}["planner"]
    assert their_planner["scope"] != "tenant"
    assert their_planner["profile"] != "fast"
    cross = await api.call(
        "PATCH", "/api/v1/runtime/llm-roles", other, json={"roles": {"planner": "fast"}}
    )
    assert cross.status_code == 422, "another tenant's profile was bindable"


async def test_seed_and_server_kind_are_stored_returned_and_patched(
    api: Api, js: JetStreamContext
) -> None:
    tenant = tenant_id()
    plain = await api.call("POST", BASE, tenant, json={"name": "plain", "model": "openai/m"})
    assert plain.status_code == 201, plain.text
    assert (plain.json()["seed"], plain.json()["server_kind"]) == (None, "generic")

    created = await api.call("POST", BASE, tenant, json={
        "name": "local", "model": "openai/qwen", "api_base": "http://127.0.0.1:8080/v1",
        "seed": 1234, "server_kind": "llama.cpp",
    })  # fmt: skip
    assert created.status_code == 201, created.text
    assert (created.json()["seed"], created.json()["server_kind"]) == (1234, "llama.cpp")
    got = await api.call("GET", f"{BASE}/local", tenant)
    assert (got.json()["seed"], got.json()["server_kind"]) == (1234, "llama.cpp"), got.text
    listed = {p["name"]: p for p in (await api.call("GET", BASE, tenant)).json()["items"]}
    assert (listed["local"]["seed"], listed["local"]["server_kind"]) == (1234, "llama.cpp")
    config = await js.key_value(streams.CONFIG.bucket)
    entry = await config.get(lm.profile_key("local", tenant))
    stored = lm.decode_profile(entry.value or b"")
    assert (stored.seed, stored.server_kind) == (1234, "llama.cpp")

    kept = await api.call("PATCH", f"{BASE}/local", tenant, json={"temperature": 0.5})
    assert (kept.json()["seed"], kept.json()["server_kind"]) == (1234, "llama.cpp"), kept.text
    patched = await api.call(
        "PATCH", f"{BASE}/local", tenant, json={"seed": None, "server_kind": "generic"}
    )
    assert patched.status_code == 200, patched.text
    assert (patched.json()["seed"], patched.json()["server_kind"]) == (None, "generic")
    again = await api.call("GET", f"{BASE}/local", tenant)
    assert (again.json()["seed"], again.json()["server_kind"]) == (None, "generic")


async def test_a_bad_seed_or_server_kind_is_refused_naming_it_and_stores_nothing(
    api: Api, js: JetStreamContext
) -> None:
    tenant = tenant_id()
    config = await js.key_value(streams.CONFIG.bucket)
    secrets = await js.key_value(streams.SECRETS.bucket)
    for extra, field, named in (
        ({"server_kind": "vllm"}, "server_kind", "'llama.cpp'"),
        ({"server_kind": None}, "server_kind", "'llama.cpp'"),
        ({"seed": -1}, "seed", "-1"),
        ({"seed": 2**31}, "seed", str(2**31)),
        ({"seed": "abc"}, "seed", "'abc'"),
        ({"seed": 1.5}, "seed", "1.5"),
    ):
        body = {"name": "bad", "model": "openai/m", "api_key": PLANTED, **extra}
        response = await api.call("POST", BASE, tenant, json=body)
        assert response.status_code == 422, (extra, response.text)
        message = response.json()["message"]
        assert repr(field) in message, (extra, message)
        assert named in message, (extra, message)
        assert PLANTED not in response.text
        with pytest.raises(KeyNotFoundError):
            await config.get(lm.profile_key("bad", tenant))
        with pytest.raises(KeyNotFoundError):
            await secrets.get(secret_key("llm-bad", tenant))
    assert (await api.call("GET", BASE, tenant)).json()["items"] == []

    created = await api.call(
        "POST", BASE, tenant, json={"name": "ok", "model": "openai/m", "seed": 3}
    )
    assert created.status_code == 201, created.text
    for extra, field in (
        ({"server_kind": "vllm"}, "server_kind"),
        ({"server_kind": None}, "server_kind"),
        ({"seed": -5}, "seed"),
    ):
        refused = await api.call("PATCH", f"{BASE}/ok", tenant, json=extra)
        assert refused.status_code == 422, (extra, refused.text)
        assert repr(field) in refused.json()["message"], (extra, refused.text)
        assert "llama.cpp" in refused.text or field == "seed", refused.text
    after = await api.call("GET", f"{BASE}/ok", tenant)
    assert after.json()["revision"] == created.json()["revision"], "a refused PATCH was stored"
    assert (after.json()["seed"], after.json()["server_kind"]) == (3, "generic")


async def test_a_profile_at_an_internal_address_is_refused_and_nothing_stored(
    api: Api, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_EGRESS_ALLOW", "")  # the suite allows loopback for its fakes
    mine = tenant_id()
    for base in ("http://127.0.0.1:9/v1", "http://2130706433:9/v1", "http://169.254.169.254/"):
        created = await api.call("POST", BASE, mine, json={
            "name": "inner", "model": "openai/x", "api_base": base, "api_key": PLANTED,
        })  # fmt: skip
        assert created.status_code == 422, created.text
        body = created.json()
        assert body["code"] == "address_not_public"
        assert body["details"] == {"field": "api_base"}
        assert "must be at a public address" in body["message"]
    assert (await api.call("GET", BASE, mine)).json()["items"] == []
    assert await _history(js, streams.SECRETS.bucket, secret_key("llm-inner", mine)) == []
    # a stored profile moved to an internal address by a PATCH is refused the same way
    monkeypatch.setenv("FLEET_EGRESS_ALLOW", "127.0.0.0/8")
    made = await api.call("POST", BASE, mine, json={
        "name": "main", "model": "openai/x", "api_base": "http://127.0.0.1:9/v1",
    })  # fmt: skip
    assert made.status_code == 201, made.text
    monkeypatch.setenv("FLEET_EGRESS_ALLOW", "")
    moved = await api.call("PATCH", f"{BASE}/main", mine, json={"api_base": "http://10.0.0.1/"})
    assert (moved.status_code, moved.json()["code"]) == (422, "address_not_public")
    kept = await api.call("GET", f"{BASE}/main", mine)
    assert kept.json()["api_base"] == "http://127.0.0.1:9/v1"
