"""The agent's turn settings: a bad `FLEET_AGENT_*` value stops the process before it connects,
with a message naming the variable and what it may be; the consumers get the settings."""

import subprocess
import sys
from pathlib import Path

import pytest

from fleet_agent.app import FAKES_ONLY
from fleet_agent.config import AgentSettings, BadAgentSetting, load_settings
from fleet_events import streams
from fleet_harness.procs import package_of


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"FLEET_AGENT_TURN_SLOTS": "0"}, "FLEET_AGENT_TURN_SLOTS: Input should be greater"),
        ({"FLEET_AGENT_ACK_WAIT_S": "soon"}, "FLEET_AGENT_ACK_WAIT_S: Input should be a valid"),
        (
            {"FLEET_AGENT_RUNNER": "gpt"},
            "FLEET_AGENT_RUNNER: Input should be 'echo', 'scripted', 'rlm' or 'chat'",
        ),
        ({"FLEET_AGENT_RUNNER": "scripted"}, "needs FLEET_AGENT_BARRIER_DIR"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(BadAgentSetting, match="bad agent setting") as refused:
        load_settings()
    assert says in str(refused.value)


def test_the_agent_process_exits_with_that_line_before_it_connects() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleet_agent"],
        env={"PATH": "/usr/bin:/bin", "FLEET_AGENT_TURN_SLOTS": "0", "NATS_URL": "nats://127.0.0.1:1"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().endswith(
        "agent: bad agent setting: FLEET_AGENT_TURN_SLOTS: Input should be greater than or "
        "equal to 1"
    )


def test_the_consumers_carry_the_ack_deadline_and_one_delivery_past_the_attempts() -> None:
    settings = AgentSettings(ack_wait_s=2.5, max_attempts=5)
    turns = settings.turn_consumer()
    assert (turns.durable, turns.ack_wait_s, turns.max_deliver) == (
        streams.TURN_WORKERS.durable, 2.5, 6,
    )  # fmt: skip
    assert settings.dispatch_consumer().ack_wait_s == 2.5


@pytest.mark.parametrize(
    "env",
    [{"FLEET_AGENT_RUNNER": "scripted"}, {"FLEET_AGENT_HOLD_BEFORE_ACK": "1"}],
    ids=["scripted runner", "ack barrier"],
)
def test_the_agent_holds_no_test_fake_and_says_where_it_is(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The fakes live in fleet_harness: `python -m fleet_agent` refuses them before it connects,
    naming the module that runs the agent composed with them."""
    done = subprocess.run(
        [sys.executable, "-m", "fleet_agent"],
        env={
            "PATH": "/usr/bin:/bin", "NATS_URL": "nats://127.0.0.1:1",
            "FLEET_AGENT_BARRIER_DIR": str(tmp_path), **env,
        },
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().endswith(f"agent: {FAKES_ONLY}")
    assert "python -m fleet_harness.agent_fakes" in FAKES_ONLY


def test_the_harness_starts_the_agent_with_its_fakes_only_when_asked() -> None:
    assert package_of("agent", {"FLEET_AGENT_RUNNER": "scripted"}) == "fleet_harness.agent_fakes"
    assert package_of("agent", {"FLEET_AGENT_HOLD_BEFORE_ACK": "1"}) == "fleet_harness.agent_fakes"
    assert package_of("agent", {"FLEET_AGENT_RUNNER": "chat"}) == "fleet_agent"
    assert package_of("sandbox-broker", {"FLEET_AGENT_RUNNER": "scripted"}) == (
        "fleet_sandbox_broker"
    )
