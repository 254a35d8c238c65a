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
