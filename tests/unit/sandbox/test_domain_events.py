"""Every lifecycle event the broker records, and every refusal it words, pinned field by field
(the builders in domain.py are the only place each is made)."""

import msgspec
import pytest

from fleet_events import sandbox as sb
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.config import LIMIT_BOUNDS
from fleet_sandbox_broker.domain import Stopwatch
from fleet_sandbox_broker.errors import BadSpec

SPEC = domain.Spec("vol", "sub", "https://git/x", "main", ("a", "b"), True)
LIMITS = sb.Limits(memory_mb=128)


def test_created_carries_everything_a_revival_or_a_clean_child_is_made_from() -> None:
    event = domain.created("s", "local", "r1", "/w/s", {"k": "v"}, LIMITS, SPEC)
    assert event == sb.SandboxCreated(
        sandbox="s", provider="local", replica="r1", workspace="/w/s", labels={"k": "v"},
        limits=LIMITS, volume="vol", volume_subpath="sub", repo_url="https://git/x", ref="main",
        context_paths=["a", "b"], local_checkout=True,
    )  # fmt: skip


def test_forked_names_its_parent() -> None:
    event = domain.forked("c", "p", "local", "r1", "/w/c", {"role": "child"}, LIMITS)
    assert event == sb.SandboxForked(
        sandbox="c", parent="p", provider="local", replica="r1", workspace="/w/c",
        labels={"role": "child"}, limits=LIMITS,
    )  # fmt: skip


def test_revival_and_replacement_say_what_was_kept() -> None:
    assert domain.revived("s", "r2", "its broker restarted") == sb.SandboxReplaced(
        sandbox="s", replaced="s", replica="r2",
        reason="its broker restarted: the sandbox runs again on the same workspace; REPL "
        "memory was lost, files were kept",
    )  # fmt: skip
    assert domain.replacement("n", "o", "r2", "it is gone") == sb.SandboxReplaced(
        sandbox="n", replaced="o", replica="r2",
        reason="it is gone; REPL memory is lost, files on the volume are kept",
    )  # fmt: skip


def test_deletions_and_contexts() -> None:
    assert domain.reaped("c", "its replica r1 is gone") == sb.SandboxDeleted(
        sandbox="c", reason="reaped: its replica r1 is gone, and a child never outlives its task"
    )
    assert domain.deleted("s", "replaced: gone") == sb.SandboxDeleted(
        sandbox="s", reason="replaced: gone"
    )
    assert domain.context_opened("s", "ctx", "i1") == sb.ContextOpened(
        sandbox="s", context="ctx", interpreter="i1"
    )
    assert domain.context_closed("s", "ctx") == sb.ContextClosed(sandbox="s", context="ctx")


def test_a_child_decision_names_no_child_when_refused() -> None:
    policy = domain.ChildPolicy("auto", "none")
    fork = domain.ChildPlan("fork", "fork it")
    assert domain.child_decided("p", "c", policy, fork, "ctx") == sb.ChildIsolationDecided(
        parent="p", child="c", mode="auto", branch="fork", reason="fork it", context="ctx"
    )
    refused = domain.ChildPlan("refused", "no")
    decided = domain.child_decided("p", "p", policy, refused, None)
    assert (decided.child, decided.branch, decided.context) == (None, "refused", None)


@pytest.mark.parametrize(
    ("limit", "reason", "recorded"),
    [
        ("exited", "deleted", None),
        ("exited", "replaced", None),
        (None, "whatever", None),
        ("exited", "crashed", sb.LimitExceeded(sandbox="s", limit="exited", detail="crashed")),
        ("memory", "deleted", sb.LimitExceeded(sandbox="s", limit="memory", detail="deleted")),
        ("memory", None, sb.LimitExceeded(sandbox="s", limit="memory", detail="")),
        ("later", None, sb.LimitExceeded(sandbox="s", limit="exited", detail="later: ")),
    ],
)
def test_what_a_stop_records(
    limit: str | None, reason: str | None, recorded: sb.LimitExceeded | None
) -> None:
    assert domain.stopped("s", limit, reason) == recorded


def test_refusals_are_worded_in_full() -> None:
    assert domain.limits_problem(sb.Limits(nproc=2), LIMIT_BOUNDS) == (
        "limits.nproc=2 is outside the allowed range [4, 1024]; ask for a value within it, or "
        "omit `limits` for the broker's defaults"
    )
    assert domain.quota_problem("t1", 5, 5) == (
        "tenant 't1' already holds 5 live sandboxes, its quota is 5: delete sandboxes it no "
        "longer needs, then ask again"
    )
    with pytest.raises(BadSpec) as caught:
        domain.page([], "x", 5, 10)
    assert str(caught.value) == (
        "cursor='x' is not a cursor this broker gave: pass a reply's `next_cursor` unchanged, "
        "or none for the first page"
    )


def view(sandbox: str, seq: int, status: str = "running") -> domain.SandboxView:
    return domain.SandboxView(sandbox, "t1", "local", "r1", f"/w/{sandbox}", seq=seq,
                              status=status)  # type: ignore[arg-type]  # fmt: skip


def test_page_bounds_and_cursors_at_their_edges() -> None:
    views = [view(f"s{n}", n) for n in range(1, 6)]
    assert [v.sandbox for v in domain.page(views, None, 1, 5)[0]] == ["s1"]
    assert len(domain.page(views, None, 5, 5)[0]) == 5
    assert [v.sandbox for v in domain.page(views, "0", 2, 5)[0]] == ["s1", "s2"]
    assert domain.page(views, None, 3, 5)[1] == "3"
    assert [v.sandbox for v in domain.page(views, "3", 5, 5)[0]] == ["s4", "s5"]
    assert domain.page(views, "9" * 19, 5, 5) == ([], None)
    for bad in (0, 6):
        with pytest.raises(BadSpec, match=rf"limit={bad} is outside the allowed range \[1, 5\]"):
            domain.page(views, None, bad, 5)


def test_a_deleted_sandbox_is_nobodys_to_take_over() -> None:
    assert not domain.orphaned(view("s", 1, "deleted"), "other", lambda w: True)
    assert domain.orphaned(view("s", 1, "stopped"), "other", lambda w: True)


def test_the_fold_keeps_every_field_of_a_created_and_a_forked_sandbox() -> None:
    views: dict[str, domain.SandboxView] = {}
    created = domain.created("p", "local", "r1", "/w/p", {"parent": "x"}, LIMITS, SPEC)
    domain.evolve(views, "t1", created, 4)
    assert views["p"] == domain.SandboxView(
        "p", "t1", "local", "r1", "/w/p", parent="x", labels={"parent": "x"}, spec=SPEC,
        limits=LIMITS, seq=4,
    )  # fmt: skip
    forked = domain.forked("c", "p", "local", "r1", "/w/c", {"k": "v"}, LIMITS)
    domain.evolve(views, "t1", forked, 9)
    assert views["c"] == domain.SandboxView(
        "c", "t1", "local", "r1", "/w/c", parent="p", labels={"k": "v"}, limits=LIMITS, seq=9
    )
    domain.evolve(views, "t1", sb.ContextOpened(sandbox="p", context="a"))
    domain.evolve(views, "t1", sb.LimitExceeded(sandbox="p", limit="exited", detail="gone"))
    domain.evolve(views, "t1", domain.replacement("n", "p", "r2", "gone"))  # another sandbox
    assert (views["p"].status, views["p"].replica) == ("stopped", "r1")
    domain.evolve(views, "t1", domain.revived("p", "r2", "back"))
    assert views["p"] == domain.SandboxView(
        "p", "t1", "local", "r2", "/w/p", parent="x", labels={"parent": "x"}, spec=SPEC,
        limits=LIMITS, seq=4,
    )  # fmt: skip
    assert domain.evolve({}, "t1", created)["p"].seq == 0
    assert domain.evolve({}, "t1", domain.revived("q", "r2", "x")) == {}


def size(reply: sb.ExecuteReply) -> int:
    return len(msgspec.json.encode(reply))


def test_a_reply_exactly_at_the_budget_is_untouched() -> None:
    reply = sb.ExecuteReply(kind="result", value="v" * 500)
    assert domain.fit_reply(reply, size(reply)) is reply
    assert domain.fit_reply(reply, size(reply) - 1).truncated


@pytest.mark.parametrize("budget", [4_000, 20_000])
def test_a_cut_reply_uses_nearly_all_of_its_budget(budget: int) -> None:
    cases = [("o" * 50_000, "v" * 50_000), ("o" * 100, "v" * 90_000), ("o" * 90_000, "v" * 100),
             ("o" * (budget * 2 // 5), "v" * 90_000)]  # fmt: skip
    for stdout, value in cases:
        fitted = domain.fit_reply(
            sb.ExecuteReply(kind="result", value=value, stdout=stdout), budget
        )
        assert budget - 600 <= size(fitted) <= budget
        assert fitted.truncated is True
        note = (
            f"\n[reply truncated to fit {budget} bytes; write large output to a file in the "
            "workspace and read it in parts]"
        )
        assert fitted.stdout.endswith(note) or fitted.stdout == stdout
        assert isinstance(fitted.value, str)
        assert fitted.value.endswith(note) or fitted.value == value


def test_a_value_that_is_not_text_is_replaced_by_a_note_with_its_size() -> None:
    value = {"rows": list(range(5000))}
    fitted = domain.fit_reply(sb.ExecuteReply(kind="final", value=value), 1000)
    assert fitted.value == f"[the cell's value, {size_of(value)} bytes as JSON, was dropped]"
    assert (fitted.kind, fitted.stdout, fitted.truncated) == ("final", "", True)
    empty = domain.fit_reply(sb.ExecuteReply(kind="result", value="", stdout="o" * 5000), 1000)
    assert empty.value == ""


def size_of(value: object) -> int:
    return len(msgspec.json.encode(value))


def test_a_cut_never_passes_its_share_even_where_escapes_weigh_double() -> None:
    text = '"' * 50 + "a" * 50  # 150 bytes of JSON, the heavy half first
    assert domain._cut(text, 150, 60) == '"' * 20
    light = 'a"' * 50
    assert domain._cut(light, 150, 50) == light[:33]
    assert domain._cut("abc", 3, 0) == ""
    assert domain._cut("\x00" * 10 + "a" * 90, 150, 5) == ""  # one \u0000 is 6 bytes


@pytest.mark.parametrize(
    ("policy", "facts", "plan"),
    [
        (domain.ChildPolicy("context"), domain.ParentFacts(True, True), domain.ChildPlan(
            "context", "RLM_CHILD_ISOLATION_MODE=context: fresh REPL context in the parent's "
            "sandbox (debugging only)")),
        (domain.ChildPolicy(), domain.ParentFacts(True, True), domain.ChildPlan(
            "clean_volume", "the parent has a durable volume: clean child with the same "
            "repo/ref/context paths and a child-specific volume subpath")),
        (domain.ChildPolicy(), domain.ParentFacts(False, True), domain.ChildPlan(
            "fork", "the parent has no durable volume: fork it")),
        (domain.ChildPolicy(), domain.ParentFacts(False, False), domain.ChildPlan(
            "clean_fallback", "fork failed (the provider cannot fork); "
            "RLM_CHILD_FORK_FALLBACK=clean: clean child")),
    ],
)  # fmt: skip
def test_each_child_decision_gives_its_reason_in_full(
    policy: domain.ChildPolicy, facts: domain.ParentFacts, plan: domain.ChildPlan
) -> None:
    assert domain.decide_child(policy, facts) == plan


@pytest.mark.parametrize(
    ("parent", "role", "finished", "reaped"),
    [(None, "child", False, True), (None, "task", False, False), (None, "task", True, True),
     ("p", "task", False, True), (None, "session", True, False), ("p", "session", False, True)],
)  # fmt: skip
def test_what_a_restart_reaps(parent: str | None, role: str, finished: bool, reaped: bool) -> None:
    box = domain.SandboxView("s", "t1", "local", "r1", "/w/s", parent=parent,
                             labels={"role": role})  # fmt: skip
    assert domain.to_reap(box, finished) is reaped


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_stopwatch_adds_up_every_stretch_of_running_time() -> None:
    clock = Clock()
    watch = Stopwatch(10.0, clock)
    clock.now += 1.0
    watch.pause()
    assert watch.spent() == 1.0  # paused: nothing is running
    clock.now += 5.0
    watch.resume()
    clock.now += 2.0
    watch.pause()
    clock.now += 5.0
    assert watch.spent() == 3.0
    watch.resume()
    assert watch.remaining() == 7.0
