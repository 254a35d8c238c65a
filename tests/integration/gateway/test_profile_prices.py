"""A profile's prices over `/api/v1/runtime/llm-profiles`, on a real nats-server: set on
create, merged on PATCH, shown on GET, refused (naming the field and the value, storing
nothing) when they are not finite numbers from 0 up; and the price set over HTTP is the one the
agent's budgeted LM charges a call, as its `LlmCalled` and a real budget replica's ledger say.
The model is the scripted LM (a FAKE model server) answering with fixed token counts."""

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_agent.lm import CallScope, LmServices, budgeted_lm
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus, new_id
from fleet_events import llm as lm
from fleet_events.budget import GetStatus, OpenTree, TreeStatus
from fleet_events.bus import Ping
from fleet_events.run import LlmCalled
from fleet_harness.procs import Launcher
from fleet_harness.scripted_lm import Reply, ScriptedLM
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader, ensure_keypair, load_private_key

BASE = "/api/v1/runtime/llm-profiles"
PROMPT_TOKENS, COMPLETION_TOKENS = 1200, 300


@pytest.fixture
async def api(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(nats_server.url, tmp_path / "gw") as running:
        yield running


async def _stored(api: Api, tenant: str, name: str) -> dict[str, Any] | None:
    got = await api.call("GET", f"{BASE}/{name}", tenant)
    if got.status_code == 404:
        return None
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


async def test_prices_are_set_on_create_merged_on_patch_and_shown(api: Api) -> None:
    tenant = tenant_id()
    created = await api.call("POST", BASE, tenant, json={
        "name": "priced", "model": "openai/scripted",
        "prices": {"input_per_mtok": 2.5, "output_per_mtok": 10},
    })  # fmt: skip
    assert created.status_code == 201, created.text
    assert created.json()["prices"] == {"input_per_mtok": 2.5, "output_per_mtok": 10.0}
    patched = await api.call("PATCH", f"{BASE}/priced", tenant, json={
        "prices": {"output_per_mtok": 12.5},
    })  # fmt: skip
    assert patched.status_code == 200, patched.text
    assert patched.json()["prices"] == {"input_per_mtok": 2.5, "output_per_mtok": 12.5}
    shown = await _stored(api, tenant, "priced")
    assert shown is not None
    assert shown["prices"] == {"input_per_mtok": 2.5, "output_per_mtok": 12.5}
    free = await api.call("POST", BASE, tenant, json={"name": "free", "model": "openai/x"})
    assert free.json()["prices"] == {"input_per_mtok": 0.0, "output_per_mtok": 0.0}


BAD_PRICES: list[tuple[str, str, str]] = [
    # (the prices object as JSON text, the field named, the value named)
    ('{"input_per_mtok": -1}', "prices.input_per_mtok", "-1"),
    ('{"output_per_mtok": "1.5"}', "prices.output_per_mtok", "'1.5'"),
    ('{"input_per_mtok": true}', "prices.input_per_mtok", "True"),
    ('{"output_per_mtok": NaN}', "prices.output_per_mtok", "nan"),
    ('{"input_per_mtok": Infinity}', "prices.input_per_mtok", "inf"),
    ('{"input_per_mtok": 1e400}', "prices.input_per_mtok", "inf"),
    (f'{{"output_per_mtok": {lm.MAX_PRICE_PER_MTOK * 10}}}', "prices.output_per_mtok", "1000000"),
    ('{"input_per_token": 3}', "prices.input_per_token", "3"),
]


@pytest.mark.parametrize(("prices", "field", "value"), BAD_PRICES)
async def test_a_bad_price_is_a_422_naming_field_and_value_and_nothing_is_stored(
    api: Api, prices: str, field: str, value: str
) -> None:
    tenant = tenant_id()
    text = f'{{"name": "p", "model": "openai/scripted", "prices": {prices}}}'
    headers = {"Content-Type": "application/json"}
    refused = await api.call("POST", BASE, tenant, content=text, headers=headers)
    assert refused.status_code == 422, refused.text
    message = refused.json()["message"]
    assert f"'{field}'" in message
    assert value in message
    assert await _stored(api, tenant, "p") is None

    made = await api.call("POST", BASE, tenant, json={
        "name": "p", "model": "openai/scripted", "prices": {"input_per_mtok": 1},
    })  # fmt: skip
    assert made.status_code == 201, made.text
    patch = f'{{"prices": {prices}}}'
    refused = await api.call("PATCH", f"{BASE}/p", tenant, content=patch, headers=headers)
    assert refused.status_code == 422, refused.text
    assert f"'{field}'" in refused.json()["message"]
    after = await _stored(api, tenant, "p")
    assert after is not None
    assert (after["revision"], after["prices"]) == (
        made.json()["revision"], {"input_per_mtok": 1.0, "output_per_mtok": 0.0}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("patch", "field"),
    [({"prices": None}, "prices"), ({"prices": {"input_per_mtok": None}}, "prices.input_per_mtok")],
)
async def test_a_null_price_is_refused_rather_than_read_as_free(
    api: Api, patch: dict[str, Any], field: str
) -> None:
    tenant = tenant_id()
    made = await api.call("POST", BASE, tenant, json={
        "name": "p", "model": "openai/scripted", "prices": {"input_per_mtok": 4},
    })  # fmt: skip
    assert made.status_code == 201, made.text
    refused = await api.call("PATCH", f"{BASE}/p", tenant, json=patch)
    assert refused.status_code == 422, refused.text
    assert f"{field!r} cannot be null" in refused.json()["message"]
    after = await _stored(api, tenant, "p")
    assert after is not None
    assert after["prices"]["input_per_mtok"] == 4.0


# -- what the budget charges -------------------------------------------------------------------


@pytest.fixture
async def budget_replica(nc: Client, js: JetStreamContext, launcher: Launcher) -> None:
    launcher.start("budget")

    async def ready() -> bool:
        try:
            pong = await rpc.call_verb(nc, bus.ping("budget"), Ping(), timeout=0.5)
        except (NatsTimeout, NoRespondersError):
            return False
        return "concurrency" in pong.details

    await eventually(ready, timeout=30, what="a budget replica")


@pytest.fixture
def line(nats_server: NatsServer, js: JetStreamContext) -> Iterator[SandboxBus]:
    """A NATS connection on a loop thread of its own, as the agent's dspy code uses it."""
    with SandboxBus(nats_server.url, tenant="price-tests", name="price-tests") as running:
        yield running


@pytest.fixture
def services(line: SandboxBus, tmp_path: Path) -> LmServices:
    js = line.nc.jetstream()
    private = load_private_key(ensure_keypair(tmp_path / "secrets").private)
    return LmServices(
        nc=line.nc,
        llm=line.run(LlmConfig.open(js), timeout=10),
        secrets=line.run(SecretsReader.open_reader(js, private), timeout=10),
    )


def _one_charged_call(
    line: SandboxBus, services: LmServices, tenant: str
) -> tuple[LlmCalled, TreeStatus]:
    """One planner call in a tree of its own, as a run's budgeted LM makes it."""
    tree = new_id()
    opened = line.call(
        bus.OPEN_TREE,
        OpenTree(request_id=new_id(), tenant=tenant, tree=tree, max_llm_calls=5),
        timeout=5,
    )
    assert opened.opened
    calls: list[LlmCalled] = []
    scope = CallScope(tenant=tenant, tree=tree, run=new_id(), role="planner", kind="sub")
    model = budgeted_lm(line, services, scope, on_call=calls.append)
    assert model("what does it cost?") == ["priced"]
    [called] = calls
    return called, line.call(bus.TREE_STATUS, GetStatus(tree=tree), timeout=5)


async def test_the_price_set_over_http_is_what_the_budget_charges_a_call(
    api: Api, line: SandboxBus, services: LmServices, budget_replica: None
) -> None:
    tenant = tenant_id()
    reply = Reply("priced", prompt_tokens=PROMPT_TOKENS, completion_tokens=COMPLETION_TOKENS)
    with ScriptedLM([reply, reply]) as fake:
        created = await api.call("POST", BASE, tenant, json={
            "name": "metered", "model": "openai/scripted", "api_base": fake.base_url,
            "prices": {"input_per_mtok": 3000, "output_per_mtok": 15000},
        })  # fmt: skip
        assert created.status_code == 201, created.text
        bound = await api.call(
            "PATCH", "/api/v1/runtime/llm-roles", tenant, json={"roles": {"planner": "metered"}}
        )
        assert bound.status_code == 200, bound.text

        called, status = await asyncio.to_thread(_one_charged_call, line, services, tenant)
        # 1200 * 3000 / 1e6 + 300 * 15000 / 1e6
        assert (called.prompt_tokens, called.completion_tokens) == (1200, 300)
        assert called.cost == pytest.approx(3.6 + 4.5)
        assert status.cost_used == pytest.approx(8.1)

        patched = await api.call("PATCH", f"{BASE}/metered", tenant, json={
            "prices": {"output_per_mtok": 0},
        })  # fmt: skip
        assert patched.status_code == 200, patched.text
        called, status = await asyncio.to_thread(_one_charged_call, line, services, tenant)
        assert called.cost == pytest.approx(3.6)  # the next call reads the profile anew
        assert status.cost_used == pytest.approx(3.6)
    assert len(fake.requests) == 2
