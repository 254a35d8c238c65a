"""MeshSettings: the three variables every process reads, each refused clearly when wrong."""

import re

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_mesh.settings import (
    DEFAULT_URL,
    BadSetting,
    MeshSettings,
    load_settings,
    read_settings,
)

VARIABLES = ("NATS_URL", "FLEET_REPLICA", "FLEET_LOG_LEVEL")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_defaults_when_nothing_is_set() -> None:
    settings = load_settings()
    assert settings.nats_url == DEFAULT_URL
    assert settings.servers == [DEFAULT_URL]
    assert settings.log_level == "INFO"
    assert settings.replica is None


def test_reads_each_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NATS_URL", "nats://10.0.0.1:4222")
    monkeypatch.setenv("FLEET_REPLICA", "budget-3")
    monkeypatch.setenv("FLEET_LOG_LEVEL", "warning")
    settings = load_settings()
    assert settings.servers == ["nats://10.0.0.1:4222"]
    assert settings.replica_for("budget") == "budget-3"
    assert settings.log_level == "WARNING"


def test_a_cluster_list_becomes_one_server_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """compose.yaml's form: nats-py reads one string as one URL, so it must arrive as a list."""
    monkeypatch.setenv("NATS_URL", "nats://nats-1:4222, nats://nats-2:4222,nats://nats-3:4222")
    assert load_settings().servers == [
        "nats://nats-1:4222",
        "nats://nats-2:4222",
        "nats://nats-3:4222",
    ]


def test_an_empty_variable_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.setenv(name, "")
    settings = load_settings()
    assert settings.nats_url == DEFAULT_URL
    assert settings.log_level == "INFO"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", settings.replica_for("agent"))


def test_host_and_port_without_a_scheme_mean_nats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NATS_URL", "127.0.0.1:4222,tls://nats-2:4222")
    assert load_settings().servers == ["nats://127.0.0.1:4222", "tls://nats-2:4222"]


def test_settings_are_frozen() -> None:
    settings = load_settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.log_level = "DEBUG"  # type: ignore[misc]


def test_a_loud_log_level_names_the_variable_the_value_and_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEET_LOG_LEVEL", "LOUD")
    with pytest.raises(BadSetting) as caught:
        load_settings()
    assert str(caught.value) == (
        "bad mesh setting: FLEET_LOG_LEVEL: 'LOUD' is not a log level: "
        "use one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "http://user:s3cret-pw@host:4222",
            r"server 1 of 1 is not a NATS server URL \(scheme 'http'\)",
        ),
        ("nats://a:4222,,nats://b:4222", "server 2 of 3 is empty"),
        ("nats://user:s3cret-pw@host:99999", "server 1 of 1 has a port that is not a number"),
        ("nats://host:0", "server 1 of 1 has port 0"),
        ("nats://", "server 1 of 1 is not a NATS server URL"),
    ],
)
def test_a_bad_url_is_refused_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch, url: str, expected: str
) -> None:
    monkeypatch.setenv("NATS_URL", url)
    with pytest.raises(BadSetting, match=r"NATS_URL: " + expected) as caught:
        load_settings()
    assert "s3cret" not in str(caught.value)
    assert "user" not in str(caught.value)


@pytest.mark.parametrize("name", ["a.b", "x*", "r" * 65, "two words"])
def test_a_replica_that_cannot_be_a_subject_token_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("FLEET_REPLICA", name)
    with pytest.raises(BadSetting, match=r"FLEET_REPLICA: .* is not a replica name"):
        load_settings()


def test_every_problem_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_REPLICA", "a.b")
    monkeypatch.setenv("FLEET_LOG_LEVEL", "LOUD")
    with pytest.raises(BadSetting) as caught:
        load_settings()
    assert "FLEET_REPLICA" in str(caught.value)
    assert "FLEET_LOG_LEVEL" in str(caught.value)


def test_generated_replica_names_are_subject_tokens_and_unique() -> None:
    settings = MeshSettings()
    names = {settings.replica_for("gateway") for _ in range(20)}
    assert len(names) == 20
    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name), name


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_DEMO_", frozen=True)

    port: int = Field(default=8080, ge=1, le=65535)
    ratio: float = Field(default=0.5, gt=0)


def test_a_service_settings_error_names_the_prefixed_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEET_DEMO_PORT", "70000")
    monkeypatch.setenv("FLEET_DEMO_RATIO", "-1")
    with pytest.raises(BadSetting) as caught:
        read_settings(ServiceSettings)
    assert str(caught.value) == (
        "bad setting: FLEET_DEMO_PORT: Input should be less than or equal to 65535; "
        "FLEET_DEMO_RATIO: Input should be greater than 0"
    )
