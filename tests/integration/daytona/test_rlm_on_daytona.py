"""A recursive turn on Daytona with no other change: the mesh of the agent's RLM tests (real
broker, budget and agent processes, the scripted LM as a FAKE model server), the broker given
FLEET_SANDBOX_PROVIDER=daytona and the three DAYTONA_* settings, pointed at the Daytona
contract FAKE. Host callbacks (`llm_query`, `sub_rlm_batched`) come from Daytona sandbox code
over the pulled channel; children are Daytona forks (files, not REPL memory), reaped after."""

from collections.abc import Iterator

import pytest

from fleet_events.run import ChildRunCompleted, LlmCalled, RunStarted
from fleet_events.session import TurnCompleted
from fleet_harness.daytona_fake import DaytonaFake, fake_in_thread
from fleet_harness.scripted_lm import ScriptedLM

from ..agent.rlm_kit import Processes, of_type, session, start_mesh, step, stop_mesh
from ..agent.test_children import assert_reaped, fan_out_script, fanned_out

pytestmark = pytest.mark.slow

AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_ENGINE_CHILD_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_LLM_CALLS": "20",
}


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaytonaFake]:
    with fake_in_thread(tmp_path_factory.mktemp("daytona-fake")) as made:
        yield made
    assert made.violations == [], made.violations


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory, fake: DaytonaFake) -> Iterator[Processes]:
    broker = {
        "FLEET_SANDBOX_PROVIDER": "daytona",
        "DAYTONA_API_KEY": "fake-key",
        "DAYTONA_API_URL": fake.url,
        "DAYTONA_TARGET": "fake",
        "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
    }
    running = start_mesh(tmp_path_factory.mktemp("rlm-daytona"), AGENT_ENV, broker)
    yield running
    stop_mesh(running)


def on_daytona(fake: DaytonaFake, sandbox: str) -> bool:
    return any(
        box.dto["labels"].get("fleet-rlm/sandbox") == sandbox for box in fake.sandboxes.values()
    )


async def test_an_rlm_turn_with_llm_query_runs_on_daytona(
    processes: Processes, fake: DaytonaFake
) -> None:
    script = [
        step("x = llm_query('Say hi to the fleet')\nprint(x)", reasoning="ask the sub model"),
        "hello fleet",
        step("SUBMIT(answer=x.upper())", reasoning="shout it"),
    ]
    with ScriptedLM(script) as model:
        async with session(processes) as s:
            await s.use_model(model)
            turn = await s.ask("greet the fleet")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnCompleted), [e for e in events if not isinstance(e, LlmCalled)]
    assert ended.answer == "HELLO FLEET"
    (started,) = of_type(events, RunStarted)
    assert on_daytona(fake, started.sandbox)
    sub = [c for c in of_type(events, LlmCalled) if c.request_kind == "sub"]
    assert [c.response for c in sub] == ["hello fleet"]  # llm_query from Daytona sandbox code


async def test_children_are_daytona_forks_with_the_files_and_are_reaped(
    processes: Processes, fake: DaytonaFake
) -> None:
    # the parent writes a file and keeps a variable; a Daytona fork copies the file only
    first = "base = 7\nopen('seed.txt', 'w').write('from the parent')"
    child = "task.split()[-1] + ':' + open('seed.txt').read() + ':' + str('base' in globals())"
    with ScriptedLM(fan_out_script(first, child)) as model:
        async with session(processes) as s:
            await s.use_model(model)
            turn = await s.ask("ROOT: fan out to three children")
            ended, events, sandbox = await fanned_out(s, turn)
            await assert_reaped(s, sandbox, "fork")
    assert on_daytona(fake, sandbox)
    assert ended.answer == " ".join(
        f"{name}:from the parent:False" for name in ("alpha", "beta", "gamma")
    )
    assert len(of_type(events, ChildRunCompleted)) == 3
