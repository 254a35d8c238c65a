"""`GET/PATCH /api/v1/runtime/settings` over the config KV, on a server of this module's own
(global settings written here must not reach other tests): values checked before anything is
stored, naming the key and what it may be; global values an admin's; a tenant's value wins over
the global one; and a change reaches two sandbox-broker replicas (processes) at their next
decision, with no restart (`rlm_child_isolation_mode`, read by the broker for every child)."""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_events import bus, new_id, streams
from fleet_events import sandbox as sb
from fleet_events.config import Setting, tenant_key
from fleet_gateway.routes.settings import is_secret
from fleet_harness.procs import Replica, start_answering
from fleet_mesh import rpc
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer

KEY = "rlm_child_isolation_mode"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    root = tmp_path_factory.mktemp("settings-nats")
    running = NatsServer(
        store_dir=root / "store", sync_interval="2m", log_path=root / "nats.log"
    ).start()
    yield running
    running.stop()


@pytest.fixture
async def nc(server: NatsServer) -> AsyncIterator[Client]:
    client = await connect(server.url, name="settings-test")
    await bootstrap(client.jetstream())
    yield client
    await client.close()


@pytest.fixture
async def api(server: NatsServer, nc: Client, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(server.url, tmp_path / "gw") as running:
        yield running


def admin(api: Api, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token(tenant, 'root', admin=True)}"}


def item(body: dict[str, Any], key: str = KEY) -> dict[str, Any]:
    found: list[dict[str, Any]] = [i for i in body["items"] if i["key"] == key]
    assert len(found) == 1, found
    return found[0]


async def _stored(nc: Client, key: str) -> bytes | None:
    kv = await nc.jetstream().key_value(streams.CONFIG.bucket)
    try:
        return (await kv.get(key)).value
    except KeyNotFoundError:
        return None


async def test_bad_values_are_refused_naming_the_key_and_store_nothing(
    api: Api, nc: Client
) -> None:
    tenant = tenant_id()
    shown = await api.call("GET", "/api/v1/runtime/settings", tenant)
    assert shown.status_code == 200, shown.text
    mode = item(shown.json())
    assert (mode["value"], mode["source"], mode["choices"]) == (
        "auto",
        "default",
        ["auto", "context"],
    )
    assert shown.json()["can_edit_global"] is False

    cases = (
        ({KEY: "sometimes"}, ["rlm_child_isolation_mode", "'sometimes'", "auto, context"]),
        ({"sandbox_warm_pool_size": -3}, ["sandbox_warm_pool_size", "non-negative integer"]),
        ({"sandbox_warm_pool_size": True}, ["sandbox_warm_pool_size", "not True"]),
        ({"no_such_setting": "1"}, ["unknown setting 'no_such_setting'", "rlm_max_depth"]),
        # the good value first: one bad value refuses the whole request
        ({"rlm_max_depth": "2", KEY: "nope"}, ["rlm_child_isolation_mode", "'nope'"]),
    )
    for updates, words in cases:
        refused = await api.call(
            "PATCH", "/api/v1/runtime/settings", tenant, json={"updates": updates}
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "invalid_setting"
        for word in words:
            assert word in refused.json()["message"], (word, refused.text)
    for key in ("rlm_max_depth", KEY, "sandbox_warm_pool_size"):
        assert await _stored(nc, tenant_key(tenant, key)) is None, f"{key} was stored"
    empty = await api.call("PATCH", "/api/v1/runtime/settings", tenant, json={"updates": {}})
    assert empty.status_code == 422


async def test_global_is_an_admins_and_a_tenants_value_wins_over_it(api: Api, nc: Client) -> None:
    mine, other = tenant_id(), tenant_id()
    body = {"updates": {"rlm_max_llm_calls": "70"}, "scope": "global"}
    refused = await api.call("PATCH", "/api/v1/runtime/settings", mine, json=body)
    assert (refused.status_code, refused.json()["code"]) == (403, "admin_required")
    assert await _stored(nc, "global.rlm_max_llm_calls") is None

    done = await api.client.patch("/api/v1/runtime/settings", json=body, headers=admin(api, mine))
    assert done.status_code == 200, done.text
    assert (done.json()["updated"], done.json()["can_edit_global"]) == (["rlm_max_llm_calls"], True)
    own = await api.call(
        "PATCH", "/api/v1/runtime/settings", mine, json={"updates": {"rlm_max_llm_calls": 12}}
    )
    assert own.status_code == 200, own.text
    mine_now = item(own.json(), "rlm_max_llm_calls")
    assert (mine_now["value"], mine_now["source"]) == ("12", "tenant")
    assert (mine_now["tenant_value"], mine_now["global_value"]) == ("12", "70")
    theirs = item((await api.call("GET", "/api/v1/runtime/settings", other)).json(),
                  "rlm_max_llm_calls")  # fmt: skip
    assert (theirs["value"], theirs["source"], theirs["tenant_value"]) == ("70", "global", None)

    cleared = await api.call(
        "PATCH", "/api/v1/runtime/settings", mine, json={"updates": {"rlm_max_llm_calls": None}}
    )
    after = item(cleared.json(), "rlm_max_llm_calls")
    assert (after["value"], after["source"]) == ("70", "global")
    unset = {"updates": {"rlm_max_llm_calls": None}, "scope": "global"}
    await api.client.patch("/api/v1/runtime/settings", json=unset, headers=admin(api, mine))
    assert await _stored(nc, "global.rlm_max_llm_calls") is None


def test_a_setting_named_as_a_secret_is_masked() -> None:
    assert is_secret(Setting("llm_api_key", "LLM_API_KEY", ""))
    assert is_secret(Setting("daytona_token", "DAYTONA_TOKEN", ""))
    assert not is_secret(Setting("rlm_max_depth", "RLM_MAX_DEPTH", "3"))
    assert not is_secret(Setting("monkey_mode", "MONKEY_MODE", ""))  # a word, not a substring


# -- reaching every replica ----------------------------------------------------------------


@pytest.fixture
def brokers(server: NatsServer, tmp_path: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for index in range(2):
            started.append(
                start_answering(
                    "sandbox-broker", server.url, tmp_path / f"broker-{index}.log",
                    {
                        "FLEET_SANDBOX_ROOT": str(tmp_path / f"sandboxes-{index}"),
                        "FLEET_SANDBOX_UID_BASE": str(370000 + 512 * index),
                        "FLEET_SANDBOX_UID_COUNT": "512", "FLEET_SANDBOX_WARM_POOL_SIZE": "0",
                    },
                )
            )  # fmt: skip
        yield started
    finally:
        for replica in started:
            replica.stop()


async def _one_on_each(nc: Client, tenant: str) -> dict[str, str]:
    """A sandbox held by each broker replica (create goes to the queue group: asked until both
    replicas hold one; 30 asks all landing on one replica would be a 1-in-2^29 draw)."""
    held: dict[str, str] = {}
    for _ in range(30):
        ask = sb.CreateSandbox(request_id=new_id(), tenant=tenant, labels={"session": "s"})
        info = await rpc.call_verb(nc, bus.CREATE_SANDBOX, ask, timeout=60)
        held.setdefault(info.replica, info.sandbox)
        if len(held) == 2:
            return held
    raise AssertionError(f"every create landed on one broker replica: {held}")


async def _branches(nc: Client, tenant: str, held: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for replica, sandbox in held.items():
        ask = sb.BuildChild(request_id=new_id(), tenant=tenant, sandbox=sandbox, context="c")
        child = await rpc.call_verb(nc, bus.BUILD_CHILD, ask, target=sandbox, timeout=60)
        out[replica] = child.branch
    return out


@pytest.mark.slow
async def test_a_change_reaches_both_broker_replicas_without_a_restart(
    api: Api, nc: Client, brokers: list[Replica]
) -> None:
    mine, other = tenant_id(), tenant_id()
    held = await _one_on_each(nc, mine)
    theirs = await _one_on_each(nc, other)
    assert set((await _branches(nc, mine, held)).values()) == {"fork"}  # the default: auto

    glob = {"updates": {KEY: "context"}, "scope": "global"}
    made = await api.client.patch("/api/v1/runtime/settings", json=glob, headers=admin(api, mine))
    assert made.status_code == 200, made.text
    try:
        assert set((await _branches(nc, mine, held)).values()) == {"context"}
        own = {"updates": {KEY: "auto"}}
        assert (await api.call("PATCH", "/api/v1/runtime/settings", mine, json=own)).is_success
        # the tenant's value wins on both replicas; the other tenant still gets the global one
        assert set((await _branches(nc, mine, held)).values()) == {"fork"}
        assert set((await _branches(nc, other, theirs)).values()) == {"context"}
    finally:
        unset = {"updates": {KEY: None}, "scope": "global"}
        await api.client.patch("/api/v1/runtime/settings", json=unset, headers=admin(api, mine))
    assert set((await _branches(nc, other, theirs)).values()) == {"fork"}
