"""Subject builders accept only ids that are one safe subject token."""

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_events import InvalidId, check_id, subjects
from fleet_events.budget import tree_subject
from fleet_events.sandbox import sandbox_subject
from fleet_events.session import log_subject, run_subject, session_filter

SAFE = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-",
    min_size=1,
    max_size=64,
)
BUILDERS: list[Callable[[str], str]] = [
    lambda x: log_subject(x, "s"),
    lambda x: log_subject("t", x),
    lambda x: run_subject("t", "s", x),
    lambda x: session_filter(x, "s"),
    lambda x: sandbox_subject("t", x),
    tree_subject,
    subjects.callback,
    lambda x: subjects.live("t", x),
]


@given(safe=SAFE)
def test_safe_ids_become_exactly_one_token(safe: str) -> None:
    assert log_subject(safe, safe).split(".") == ["fleet", "session", safe, safe, "log"]
    assert tree_subject(safe).split(".")[-1] == safe


@given(
    prefix=st.text(max_size=10),
    bad=st.sampled_from([".", "*", ">", " ", "\t", "\n", "/", "é"]),
    suffix=st.text(max_size=10),
    which=st.integers(min_value=0, max_value=len(BUILDERS) - 1),
)
def test_ids_with_separators_wildcards_or_spaces_are_rejected(
    prefix: str, bad: str, suffix: str, which: int
) -> None:
    with pytest.raises(InvalidId, match="use 1-64 characters"):
        BUILDERS[which](prefix + bad + suffix)


@given(length=st.integers(min_value=65, max_value=300), which=st.integers(0, len(BUILDERS) - 1))
def test_ids_over_64_characters_are_rejected(length: int, which: int) -> None:
    with pytest.raises(InvalidId):
        BUILDERS[which]("a" * length)


def test_the_error_names_the_kind_and_the_value() -> None:
    with pytest.raises(InvalidId) as caught:
        check_id("session", "a.b")
    assert "invalid session id 'a.b'" in str(caught.value)
    with pytest.raises(InvalidId):
        check_id("session", "")
    with pytest.raises(InvalidId):
        check_id("session", 42)


def test_event_command_and_rpc_subject_spaces_never_overlap() -> None:
    from fleet_events import streams

    captured = [s.split(".")[1] for spec in streams.STREAMS for s in spec.subjects]
    assert len(captured) == len(set(captured))
    for core in (subjects.rpc("budget", "grant"), subjects.callback("i"), subjects.live("t", "s")):
        assert core.split(".")[1] not in captured


# -- parsing: every shape the builders make parses back, and nothing else does -----------------


@given(tenant=SAFE, session=SAFE, run=SAFE)
def test_session_subjects_parse_back_to_what_built_them(
    tenant: str, session: str, run: str
) -> None:
    assert subjects.parse_session(log_subject(tenant, session)) == subjects.SessionSubject(
        tenant, session
    )
    assert subjects.parse_session(run_subject(tenant, session, run)) == subjects.SessionSubject(
        tenant, session, run
    )
    assert subjects.tenant_token(sandbox_subject(tenant, session)) == tenant


@pytest.mark.parametrize(
    "subject",
    [
        "fleet.session.acme.s1.run.r1.extra",
        "fleet.session.acme.s1.log.extra",
        "fleet.session.acme.s1.tail",
        "fleet.session.acme.s1",
        "fleet.session.*.s1.log",
        "fleet.sandbox.acme.s1",
        "other.session.acme.s1.log",
    ],
)
def test_other_shapes_are_no_session_subject(subject: str) -> None:
    assert subjects.parse_session(subject) is None


def test_patterns_build_filters_and_parse() -> None:
    assert subjects.SESSION_LOG.filter() == "fleet.session.*.*.log"
    assert subjects.SESSION_RUN.filter(tenant="t", run="r") == "fleet.session.t.*.run.r"
    assert subjects.session_scope("t", "s") == session_filter("t", "s") == "fleet.session.t.s.>"
    assert subjects.WORK.parse("fleet.work.agent.turn") == {"service": "agent", "kind": "turn"}
    assert subjects.SANDBOX.parse("fleet.sandbox.t") is None
    with pytest.raises(TypeError, match="takes tenant, session"):
        subjects.SESSION_LOG.build(tenant="t")
    with pytest.raises(InvalidId):
        subjects.SESSION_LOG.filter(tenant="a.b")
    assert subjects.is_wildcard("fleet.session.>")
    assert not subjects.is_wildcard("fleet.a.b")


def test_the_bus_catalog_names_the_channel_of_a_subject() -> None:
    from fleet_events import bus

    found = bus.channel_of(run_subject("t", "s", "r"))
    assert found is not None
    assert found[0].name == "session-run"
    assert found[1]["run"] == "r"
    found = bus.channel_of(subjects.work("agent", "turn"))
    assert found is not None
    assert found[0].name == "agent-turn"
    assert bus.channel_of("fleet.nowhere.x") is None
