"""The budget-aware LM against a real budget replica, the real stores and the scripted LM (a
FAKE model server): a grant before every call, usage after it at the profile's prices, a
refusal the model can read, and keys that go only where their profile sends them."""

import concurrent.futures
import logging
import os
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
import msgspec
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext

from fleet_agent.lm import (
    BudgetSpent,
    CallScope,
    LmCallFailed,
    LmNotConfigured,
    LmServices,
    PendingUsage,
    budgeted_lm,
)
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus, new_id, streams
from fleet_events.budget import GetStatus, OpenTree, TreeStatus, tree_subject
from fleet_events.bus import Ping
from fleet_events.chain import TYPE_HEADER
from fleet_events.llm import LlmProfile, Prices, cost
from fleet_events.run import LlmCalled
from fleet_harness.procs import Launcher
from fleet_harness.scripted_lm import Reply, ScriptedLM, by_marker
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader, ensure_keypair, load_private_key
from fleet_mesh.store import open_store

ADAPTER = dspy.ChatAdapter(use_json_adapter_fallback=False)
PLANTED = "sk-planted-" + "5e1d2c" * 6
PRICES = Prices(input_per_mtok=3000.0, output_per_mtok=15000.0)


def fields(**values: object) -> str:
    body = "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items())
    return body + "[[ ## completed ## ]]\n"


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
    """A NATS connection on a loop thread of its own, as the agent's dspy code uses it (after
    `js` has bootstrapped the buckets)."""
    with SandboxBus(nats_server.url, tenant="lm-tests", name="lm-tests") as running:
        yield running


@pytest.fixture
def private_key(tmp_path: Path) -> Any:
    return load_private_key(ensure_keypair(tmp_path / "secrets").private)


@pytest.fixture
def services(line: SandboxBus, private_key: Any) -> LmServices:
    js = line.nc.jetstream()
    return LmServices(
        nc=line.nc,
        llm=line.run(LlmConfig.open(js), timeout=10),
        secrets=line.run(SecretsReader.open_reader(js, private_key), timeout=10),
    )


class Tenant:
    """One tenant of its own per test, with helpers that run on the bus loop."""

    def __init__(self, line: SandboxBus, services: LmServices) -> None:
        self.id = f"t-{new_id()[:12]}"
        self.line = line
        self.services = services

    def profile(self, role: str = "planner", **fields: Any) -> LlmProfile:
        profile = LlmProfile(**{"name": f"p-{role}", "prices": PRICES, **fields})
        self.line.run(self.services.llm.put_profile(profile, tenant=self.id), timeout=10)
        self.line.run(self.services.llm.set_role(role, profile.name, tenant=self.id), timeout=10)
        return profile

    def secret(self, name: str, value: str, *, scope_global: bool = False) -> None:
        tenant = None if scope_global else self.id
        self.line.run(self.services.secrets.put(name, value, tenant=tenant), timeout=10)

    def open_tree(self, max_llm_calls: int) -> str:
        tree = new_id()
        request = OpenTree(
            request_id=new_id(), tenant=self.id, tree=tree, max_llm_calls=max_llm_calls
        )
        reply = self.line.call(bus.OPEN_TREE, request, timeout=5)
        assert reply.opened
        return tree

    def status(self, tree: str) -> TreeStatus:
        return self.line.call(bus.TREE_STATUS, GetStatus(tree=tree), timeout=5)

    def lm(
        self, tree: str, role: str = "planner", kind: Any = "sub"
    ) -> tuple[Any, list[LlmCalled]]:
        calls: list[LlmCalled] = []
        scope = CallScope(tenant=self.id, tree=tree, run=new_id(), role=role, kind=kind)
        return budgeted_lm(self.line, self.services, scope, on_call=calls.append), calls


@pytest.fixture
def tenant(line: SandboxBus, services: LmServices, budget_replica: None) -> Tenant:
    return Tenant(line, services)


def test_every_call_is_granted_recorded_and_priced_by_the_profile(tenant: Tenant) -> None:
    script = by_marker({"Capital of France": Reply(fields(answer="Paris"), completion_tokens=9)})
    with ScriptedLM(script, api_key=PLANTED) as fake:
        tenant.secret("openai", PLANTED)
        tenant.profile(model="openai/scripted", api_base=fake.base_url, secret="openai")
        tree = tenant.open_tree(max_llm_calls=2)
        lm, calls = tenant.lm(tree)
        with dspy.context(lm=lm, adapter=ADAPTER):
            assert (
                dspy.Predict("question -> answer")(question="Capital of France?").answer == "Paris"
            )
        assert fake.calls == {"Capital of France": 1}
        assert fake.requests[0].authorization == f"Bearer {PLANTED}"  # resolved at call time

        [called] = calls
        prompt = len(fake.requests[0].prompt_text.split())
        assert (called.prompt_tokens, called.completion_tokens) == (prompt, 9)
        assert called.cost == pytest.approx(cost(PRICES, prompt, 9))
        assert called.cost > 0  # LiteLLM's offline map would have priced this model at 0
        assert called.model == "openai/scripted"
        assert (called.role, called.request_kind) == ("planner", "sub")
        assert called.response == fields(answer="Paris")
        assert isinstance(called.messages, list)  # small enough to travel inline
        assert [m.role for m in called.messages] == ["system", "user"]
        assert "Capital of France?" in str(called.messages[-1].content)
        assert called.grant_id
        assert called.request_hash
        assert called.latency_ms > 0

        status = tenant.status(tree)
        assert (status.granted, status.calls_recorded) == (1, 1)
        assert status.tokens_used == prompt + 9
        assert status.cost_used == pytest.approx(called.cost)


def test_a_refused_grant_makes_no_model_call_and_says_budget_spent(tenant: Tenant) -> None:
    with ScriptedLM(["one", "two", "three"]) as fake:
        tenant.profile(model="openai/scripted", api_base=fake.base_url)
        tree = tenant.open_tree(max_llm_calls=2)
        lm, calls = tenant.lm(tree)
        assert lm("a") == ["one"]
        assert lm("b") == ["two"]
        with pytest.raises(BudgetSpent, match=r"^budget spent: "):
            lm("c")
        assert sum(fake.calls.values()) == 2  # the refused call never reached the model
        assert len(calls) == 2
        status = tenant.status(tree)
        assert (status.granted, status.remaining, status.refusals) == (2, 0, 1)


def test_sandbox_code_reads_the_refusal_and_the_next_step_sees_it(tenant: Tenant) -> None:
    """An RLM whose `llm_query` runs through the budgeted sub LM; the main LM is the fake
    directly (so only sub calls are charged here): the second `llm_query` is refused inside
    the cell, the code prints the message, and the model's next prompt carries it."""
    steps = by_marker(
        {
            "budget spent": fields(reasoning="out of budget", code="SUBMIT(answer='done')"),
            "Variable: `text`": fields(
                reasoning="ask twice",
                code="print(llm_query('first'))\n"
                "try:\n    llm_query('second')\nexcept Exception as exc:\n    print(exc)",
            ),
        }
    )
    with ScriptedLM(steps) as main_fake, ScriptedLM(["sub answer"] * 3) as sub_fake:
        tenant.profile(role="delegate", model="openai/scripted", api_base=sub_fake.base_url)
        tree = tenant.open_tree(max_llm_calls=1)
        sub_lm, calls = tenant.lm(tree, role="delegate")
        main_lm = dspy.LM(
            "openai/main", api_base=main_fake.base_url, api_key="x", cache=False, num_retries=0
        )
        rlm = dspy.RLM(
            "text -> answer", max_iters=3, sub_lm=sub_lm, interpreter_factory=dspy.LocalInterpreter
        )
        with dspy.context(lm=main_lm, adapter=ADAPTER):
            assert rlm(text="x").answer == "done"
        assert sum(sub_fake.calls.values()) == 1
        assert [c.request_kind for c in calls] == ["sub"]
        second_step = main_fake.requests[1].prompt_text
        assert "sub answer" in second_step
        assert "budget spent: " in second_step


def test_a_run_step_is_granted_as_a_step(tenant: Tenant) -> None:
    with ScriptedLM([fields(reasoning="r", code="SUBMIT(answer='ok')")]) as fake:
        tenant.profile(model="openai/scripted", api_base=fake.base_url)
        tree = tenant.open_tree(max_llm_calls=5)
        main_lm, calls = tenant.lm(tree, kind="step")
        rlm = dspy.RLM("text -> answer", max_iters=2, interpreter_factory=dspy.LocalInterpreter)
        with dspy.context(lm=main_lm, adapter=ADAPTER):
            assert rlm(text="x").answer == "ok"
        assert [c.request_kind for c in calls] == ["step"]
        assert all(c.grant_id for c in calls)  # granted, as a step of the run
        status = tenant.status(tree)
        # a run's own steps are bounded by max_iters, not the tree's max_llm_calls (DESIGN §5)
        assert (status.granted, status.remaining, status.calls_recorded) == (0, 5, 1)


def test_a_rotated_key_applies_to_the_next_call(tenant: Tenant) -> None:
    with ScriptedLM(["old key works", "new key works"], api_key="key-one-aaaa") as fake:
        tenant.secret("k1", "key-one-aaaa")
        profile = tenant.profile(model="openai/scripted", api_base=fake.base_url, secret="k1")
        lm, _ = tenant.lm(tenant.open_tree(max_llm_calls=5))
        assert lm("x") == ["old key works"]

        stored = tenant.line.run(
            tenant.services.llm.get_profile(profile.name, tenant=tenant.id), timeout=5
        )
        assert stored is not None
        tenant.secret("k2", "key-two-bbbb")
        rotated = msgspec.structs.replace(profile, secret="k2")
        tenant.line.run(
            tenant.services.llm.put_profile(rotated, tenant=tenant.id, expect=stored.revision),
            timeout=5,
        )
        fake.api_key = "key-two-bbbb"
        assert lm("y") == ["new key works"]
        assert [r.authorization for r in fake.requests] == [
            "Bearer key-one-aaaa",
            "Bearer key-two-bbbb",
        ]


def test_a_profile_without_a_secret_never_sends_the_hosts_provider_key(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a tenant profile with no secret, pointed at a server the tenant controls. LiteLLM
    would fill the key from OPENAI_API_KEY in the agent's environment and send it there."""
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    with ScriptedLM(["fine"]) as attacker:
        tenant.profile(model="openai/scripted", api_base=attacker.base_url)
        lm, _ = tenant.lm(tenant.open_tree(max_llm_calls=2))
        assert lm("hello") == ["fine"]
        assert all(PLANTED not in (r.authorization or "") for r in attacker.requests)
        assert attacker.requests[0].authorization == "Bearer unused"


def test_a_tenant_profile_cannot_send_a_global_key_to_its_own_server(tenant: Tenant) -> None:
    """Attack: the admin's global key is named by a tenant's profile whose address is the
    tenant's own server. The tenant's scope has no such secret: refused, nothing sent."""
    name = f"admin-{new_id()[:8]}"
    tenant.secret(name, PLANTED, scope_global=True)
    with ScriptedLM(["stolen"]) as attacker:
        tenant.profile(model="openai/scripted", api_base=attacker.base_url, secret=name)
        tree = tenant.open_tree(max_llm_calls=2)
        lm, _ = tenant.lm(tree)
        with pytest.raises(LmNotConfigured, match=f"secret '{name}' is not stored in tenant"):
            lm("hello")
        assert attacker.requests == []
        assert tenant.status(tree).granted == 0  # resolved before the grant: nothing spent


def test_a_provider_error_echoing_the_key_is_scrubbed(
    tenant: Tenant, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider that echoes the key it was sent in its error (some do, partly masked): the
    error the run records and raises carries no key, nor does any log line or ledger event."""
    caplog.set_level(logging.DEBUG)
    echo = Reply(f"Incorrect API key provided: {PLANTED}. Check it.", status=400)
    with ScriptedLM([echo]) as fake:
        tenant.secret("openai", PLANTED)
        tenant.profile(model="openai/scripted", api_base=fake.base_url, secret="openai")
        tree = tenant.open_tree(max_llm_calls=2)
        lm, calls = tenant.lm(tree)
        with pytest.raises(LmCallFailed) as caught:
            lm("hello")
        assert PLANTED not in str(caught.value)
        assert "Incorrect API key provided: ***" in str(caught.value)
        [called] = calls
        assert called.error
        assert PLANTED not in called.error
        assert PLANTED not in msgspec.json.encode(called).decode()
        status = tenant.status(tree)
        assert (status.granted, status.calls_recorded) == (1, 1)  # failed calls are recorded too
    assert PLANTED not in caplog.text
    ledger = tenant.line.run(raw_subject(tenant.line, tree_subject(tree)), timeout=10)
    assert ledger  # the grant and the usage are there, and carry no key
    assert all(PLANTED.encode() not in raw for raw in ledger)


async def raw_subject(line: SandboxBus, subject: str) -> list[bytes]:
    store = await open_store(line.nc.jetstream(), streams.BUDGET)
    return [raw.data async for raw in store.read_raw(subject)]


async def test_the_async_path_is_granted_too(tenant: Tenant) -> None:
    """`aforward` reaches the async engine from inside a running loop that is not the one
    owning the connection: it must neither deadlock nor skip the grant."""
    with ScriptedLM(["async answer"]) as fake:
        tenant.profile(model="openai/scripted", api_base=fake.base_url)
        tree = tenant.open_tree(max_llm_calls=1)
        lm, calls = tenant.lm(tree)
        assert await lm.acall("hi") == ["async answer"]
        with pytest.raises(BudgetSpent, match=r"^budget spent: "):
            await lm.acall("again")
        assert sum(fake.calls.values()) == 1
        assert len(calls) == 1


def test_a_runs_reports_in_flight_land_before_its_next_grant_and_its_end(tenant: Tenant) -> None:
    """With a run's `PendingUsage`, a call's answer does not wait for its usage report; the
    run's next grant does, and `settle` (the run's end) waits for the last: on the tree's
    ledger every call's usage precedes the next grant, each call is recorded exactly once."""
    with ScriptedLM(["one", "two", "three"]) as fake:
        tenant.profile(model="openai/scripted", api_base=fake.base_url)
        tree = tenant.open_tree(max_llm_calls=3)
        usage = PendingUsage(tenant.line.submit, timeout_s=20)
        scope = CallScope(tenant=tenant.id, tree=tree, run=new_id(), role="planner", kind="sub")
        counter = iter(range(1, 10))
        lm = budgeted_lm(
            tenant.line, tenant.services, scope, usage=usage,
            grant_id=lambda: f"{scope.run}-g{next(counter)}",
        )  # fmt: skip
        assert [lm("a")[0], lm("b")[0], lm("c")[0]] == ["one", "two", "three"]
        usage.settle()
    status = tenant.status(tree)
    assert (status.granted, status.calls_recorded) == (3, 3)
    ledger = tenant.line.run(ledger_ids(tenant.line, tree_subject(tree)), timeout=10)
    decisions = [(kind, ident) for kind, ident in ledger if kind != "budget.tree_opened"]
    g = [f"{scope.run}-g{n}" for n in (1, 2, 3)]
    assert decisions == [
        ("budget.granted", g[0]), ("budget.usage_recorded", f"{g[0]}-usage"),
        ("budget.granted", g[1]), ("budget.usage_recorded", f"{g[1]}-usage"),
        ("budget.granted", g[2]), ("budget.usage_recorded", f"{g[2]}-usage"),
    ]  # fmt: skip


def test_a_report_that_fails_fails_the_runs_next_grant() -> None:
    """A report left in flight is not forgotten: its failure is raised by `settle`."""

    def failing(work: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        work.close()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_exception(rpc.NoFinalAnswer("budget.usage: no answer in 15s"))
        return future

    usage = PendingUsage(failing, timeout_s=1)

    async def report() -> None:
        pass

    usage.send(report())
    with pytest.raises(rpc.NoFinalAnswer, match="no answer"):
        usage.settle()
    usage.settle()  # raised once: the next settle has nothing in flight


async def ledger_ids(line: SandboxBus, subject: str) -> list[tuple[str, str]]:
    store = await open_store(line.nc.jetstream(), streams.BUDGET)
    return [
        (raw.headers.get(TYPE_HEADER, ""), raw.headers.get("Nats-Msg-Id", ""))
        async for raw in store.read_raw(subject)
    ]
