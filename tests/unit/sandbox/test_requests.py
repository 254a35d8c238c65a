"""What a request may ask for and how much of an answer fits: pure decisions of the broker."""

import math

import msgspec
import pytest

from fleet_events import sandbox as sb
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.config import LIMIT_BOUNDS, BrokerSettings
from fleet_sandbox_broker.errors import BadSpec


def test_the_default_limits_are_within_the_default_bounds() -> None:
    assert domain.limits_problem(BrokerSettings().default_limits(), LIMIT_BOUNDS) is None


@pytest.mark.parametrize("field", list(sb.Limits.__struct_fields__))
def test_each_limit_is_held_to_its_floor_and_ceiling(field: str) -> None:
    low, high = LIMIT_BOUNDS[field]
    kind = type(getattr(sb.Limits(), field))
    for value in (low, high):
        limits = msgspec.structs.replace(sb.Limits(), **{field: kind(value)})
        assert domain.limits_problem(limits, LIMIT_BOUNDS) is None
    for value in (-1, low - 1, high + 1, 0):
        if low <= value <= high:
            continue
        limits = msgspec.structs.replace(sb.Limits(), **{field: kind(value)})
        problem = domain.limits_problem(limits, LIMIT_BOUNDS)
        assert problem is not None
        assert f"limits.{field}={kind(value)!r}" in problem
        assert f"[{low:g}, {high:g}]" in problem


def test_a_nan_wall_limit_is_refused() -> None:
    limits = sb.Limits(wall_s=math.nan)
    assert domain.limits_problem(limits, LIMIT_BOUNDS) is not None


def test_settings_refuse_defaults_outside_their_bounds() -> None:
    with pytest.raises(ValueError, match=r"limits\.memory_mb=64"):
        BrokerSettings(memory_mb=64, limit_bounds={**LIMIT_BOUNDS, "memory_mb": (128, 256)})


def test_the_quota_refuses_at_its_size_only() -> None:
    assert domain.quota_problem("t1", 2, 3) is None
    refused = domain.quota_problem("t1", 3, 3)
    assert refused is not None
    assert "'t1' already holds 3 live sandboxes, its quota is 3" in refused


def view(sandbox: str, seq: int) -> domain.SandboxView:
    return domain.SandboxView(sandbox, "t1", "local", "r1", f"/w/{sandbox}", seq=seq)


def test_pages_follow_stream_order_and_survive_deletes_between_them() -> None:
    views = [view("c", 30), view("a", 10), view("b", 20)]
    first, cursor = domain.page(views, None, 2, 500)
    assert [v.sandbox for v in first] == ["a", "b"]
    assert cursor == "20"
    rest, end = domain.page([v for v in views if v.sandbox != "b"], cursor, 2, 500)
    assert ([v.sandbox for v in rest], end) == (["c"], None)
    exact, none_left = domain.page(views, None, 3, 500)
    assert (len(exact), none_left) == (3, None)


@pytest.mark.parametrize(("cursor", "limit"), [(None, 0), (None, 501), ("x1", 5), ("9" * 20, 5)])
def test_a_bad_page_request_names_what_was_wrong(cursor: str | None, limit: int) -> None:
    with pytest.raises(BadSpec, match=r"limit=|cursor="):
        domain.page([], cursor, limit, 500)


def size(reply: sb.ExecuteReply) -> int:
    return len(msgspec.json.encode(reply))


def test_a_reply_that_fits_is_untouched() -> None:
    reply = sb.ExecuteReply(kind="result", value="v" * 100, stdout="o" * 100)
    assert domain.fit_reply(reply, 10_000) is reply


@pytest.mark.parametrize(
    ("stdout", "value"),
    [("o" * 50_000, "v" * 50_000), ("o" * 100, "v" * 90_000), ("o" * 90_000, None),
     ('"\\\n' * 20_000, "é" * 40_000), ("", {"rows": list(range(30_000))})],
)  # fmt: skip
def test_a_reply_too_big_is_cut_to_fit_and_says_so(stdout: str, value: object) -> None:
    reply = sb.ExecuteReply(kind="result", value=value, stdout=stdout)
    fitted = domain.fit_reply(reply, 20_000)
    assert size(fitted) <= 20_000
    assert fitted.truncated
    text = f"{fitted.stdout}{fitted.value}"
    assert "truncated" in text or "dropped" in text
    if isinstance(value, str):  # each keeps what its share allows, from its start
        assert isinstance(fitted.value, str)
        assert fitted.value[:5] == value[:5]
    if value is None:
        assert fitted.value is None
    assert fitted.stdout[:5] == stdout[:5]


def test_stops_explained_by_their_own_event_record_nothing() -> None:
    assert domain.stopped("s", "exited", "deleted") is None
    assert domain.stopped("s", None, None) is None
    event = domain.stopped("s", "memory", "memory limit of 64 MiB reached")
    assert event == sb.LimitExceeded(
        sandbox="s", limit="memory", detail="memory limit of 64 MiB reached"
    )


def test_a_revival_names_the_replica_that_holds_it_now() -> None:
    views: dict[str, domain.SandboxView] = {}
    created = sb.SandboxCreated(sandbox="s", provider="local", replica="old", workspace="/w/s")
    domain.evolve(views, "t1", created, seq=7)
    domain.evolve(views, "t1", domain.revived("s", "new", "its replica old is gone"))
    assert (views["s"].replica, views["s"].status, views["s"].seq) == ("new", "running", 7)
    assert domain.orphaned(views["s"], "other", lambda w: w == "/w/s")
    assert not domain.orphaned(views["s"], "new", lambda w: True)
    assert not domain.orphaned(views["s"], "other", lambda w: False)


def test_a_stop_the_event_type_cannot_name_is_recorded_as_exited_with_its_detail() -> None:
    event = domain.stopped("s", "a-future-limit", "why it stopped")
    assert event is not None
    assert (event.limit, event.detail) == ("exited", "a-future-limit: why it stopped")
    decoded = msgspec.json.decode(msgspec.json.encode(event), type=sb.LimitExceeded)
    assert decoded == event
