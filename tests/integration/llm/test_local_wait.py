"""A model call to the embedded model while `fleet up` still installs it (its first start on a
machine: the mesh serves meanwhile) waits for it, saying so to the session's watchers, and asks
the budget for nothing until the model is up; a model that failed to start, or one still
starting at the run's deadline, fails the call saying what the model is doing. Against a real
budget replica, with the scripted LM (a FAKE model server) standing in for the model."""

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import msgspec
import pytest

from fleet_agent.lm import CallScope, LmCallFailed, budgeted_lm
from fleet_agent.run.failures import RunCancelledError
from fleet_events import new_id, streams
from fleet_events.bus import CALL_STARTED_DELTA, MODEL_WAITING_DELTA
from fleet_events.llm import LOCAL_MODEL_KEY, LocalModelState, LocalState
from fleet_harness.scripted_lm import ScriptedLM
from fleet_harness.waits import eventually_sync

from ..agent.test_lm_budget import Tenant, budget_replica, line, private_key, services, tenant

__all__ = ["budget_replica", "line", "private_key", "services", "tenant"]


class Local:
    """The embedded model's state in the config bucket, as `fleet up` writes it."""

    def __init__(self, tenant: Tenant, api_base: str) -> None:
        self.tenant = tenant
        self.api_base = api_base

    def set(self, state: LocalState, detail: str = "", advice: str = "", eta_s: float = 0) -> None:
        value = LocalModelState(
            state=state, model="qwen2.5-coder-0.5b", updated_at=datetime.now(UTC),
            api_base=self.api_base, detail=detail, advice=advice, eta_s=eta_s or None,
        )  # fmt: skip

        async def put() -> None:
            kv = await self.tenant.line.nc.jetstream().key_value(streams.CONFIG.bucket)
            await kv.put(LOCAL_MODEL_KEY, msgspec.json.encode(value))

        self.tenant.line.run(put(), timeout=10)

    def clear(self) -> None:
        async def delete() -> None:
            kv = await self.tenant.line.nc.jetstream().key_value(streams.CONFIG.bucket)
            await kv.delete(LOCAL_MODEL_KEY)

        self.tenant.line.run(delete(), timeout=10)


@pytest.fixture
def fake() -> Iterator[ScriptedLM]:
    with ScriptedLM(["the model's answer"]) as running:
        yield running


@pytest.fixture
def local(tenant: Tenant, fake: ScriptedLM) -> Iterator[Local]:
    tenant.profile("delegate", model="openai/scripted", api_base=fake.base_url)
    state = Local(tenant, fake.base_url)
    yield state
    state.clear()


def lm(
    tenant: Tenant,
    told: list[tuple[str, str]],
    deadline: float | None = None,
    cancel: threading.Event | None = None,
) -> Any:
    tree = tenant.open_tree(max_llm_calls=2)
    scope = CallScope(tenant=tenant.id, tree=tree, run=new_id(), role="delegate", kind="sub")

    def checkpoint() -> None:
        if cancel is not None and cancel.is_set():
            raise RunCancelledError("the turn was cancelled")

    made = budgeted_lm(
        tenant.line, tenant.services, scope, checkpoint=checkpoint,
        announce=lambda kind, text: told.append((kind, text)), run_deadline=deadline,
    )  # fmt: skip
    made.tree = tree
    return made


def test_a_call_waits_for_the_embedded_model_to_come_up_and_says_how_long(
    tenant: Tenant, fake: ScriptedLM, local: Local
) -> None:
    local.set("building", "building llama-cpp-python: 120s so far", eta_s=600)
    told: list[tuple[str, str]] = []
    model = lm(tenant, told)
    answers: list[Any] = []
    call = threading.Thread(target=lambda: answers.append(model("a question")))
    call.start()
    eventually_sync(lambda: told, timeout=10, what="the call to say it waits")
    kind, text = told[0]
    assert kind == MODEL_WAITING_DELTA
    assert "waiting for the local model: building" in text
    assert "~10 min left" in text
    assert fake.requests == []  # nothing sent to a server that is not up...
    assert tenant.status(model.tree).granted == 0  # ...and nothing granted for it yet
    local.set("up", "answering")
    call.join(timeout=30)
    assert answers == [["the model's answer"]]
    kinds = [k for k, _ in told]  # said while it waited (again every 10 s), then sent
    assert kinds[-1] == CALL_STARTED_DELTA
    assert set(kinds[:-1]) == {MODEL_WAITING_DELTA}
    assert len(fake.requests) == 1
    assert tenant.status(model.tree).granted == 1


def test_a_model_that_failed_to_start_fails_the_call_with_its_reason_and_advice(
    tenant: Tenant, fake: ScriptedLM, local: Local
) -> None:
    local.set("failed", "cmake is not installed", advice="apt-get install cmake; or --llm none")
    told: list[tuple[str, str]] = []
    model = lm(tenant, told)
    with pytest.raises(LmCallFailed, match="llm_unavailable") as failed:
        model("a question")
    assert "cmake is not installed" in str(failed.value)
    assert "apt-get install cmake; or --llm none" in str(failed.value)
    assert fake.requests == []
    assert tenant.status(model.tree).granted == 0


def test_a_model_still_starting_at_the_runs_deadline_fails_the_call_saying_so(
    tenant: Tenant, fake: ScriptedLM, local: Local
) -> None:
    local.set("installing", "downloading the model weights", eta_s=90)
    told: list[tuple[str, str]] = []
    model = lm(tenant, told, deadline=time.time() + 1.0)
    with pytest.raises(LmCallFailed, match="still starting") as failed:
        model("a question")
    assert "~2 min left" in str(failed.value)
    assert "fleet status" in str(failed.value)
    assert fake.requests == []
    assert [k for k, _ in told] == [MODEL_WAITING_DELTA]


def test_a_profile_on_another_server_never_waits_for_the_embedded_model(
    tenant: Tenant, fake: ScriptedLM, local: Local
) -> None:
    elsewhere = Local(tenant, "http://127.0.0.1:9/v1")  # the embedded model is another server
    elsewhere.set("building", "building llama-cpp-python", eta_s=600)
    told: list[tuple[str, str]] = []
    assert lm(tenant, told)("a question") == ["the model's answer"]
    assert [k for k, _ in told] == [CALL_STARTED_DELTA]
    assert json.loads(told[0][1])["role"] == "delegate"


def test_a_cancelled_turn_stops_waiting_for_the_embedded_model(
    tenant: Tenant, fake: ScriptedLM, local: Local
) -> None:
    local.set("loading", "the server is loading the model", eta_s=20)
    told: list[tuple[str, str]] = []
    cancel = threading.Event()
    model = lm(tenant, told, cancel=cancel)
    raised: list[BaseException] = []

    def call() -> None:
        try:
            model("a question")
        except BaseException as exc:  # what the waiting call ended with
            raised.append(exc)

    waiting = threading.Thread(target=call)
    waiting.start()
    eventually_sync(lambda: told, timeout=10, what="the call to say it waits")
    cancel.set()
    waiting.join(timeout=15)
    assert not waiting.is_alive()
    (stopped,) = raised  # the run's own cancel, through dspy unwrapped: the run ends cancelled
    assert isinstance(stopped, RunCancelledError)
    assert fake.requests == []
    assert tenant.status(model.tree).granted == 0
