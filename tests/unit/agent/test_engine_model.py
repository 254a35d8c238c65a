"""The engine's small pieces that threads share: the cancel flag, the slot lease, derived ids."""

from fleet_agent.engine import CancelFlag, child_run_id, root_run_id, tree_id
from fleet_agent.engine.model import SlotLease
from fleet_events import check_id


def test_a_slot_is_lent_once_for_overlapping_waits_and_reclaimed_after_the_last() -> None:
    calls: list[str] = []
    lease = SlotLease(lend=lambda: calls.append("lend"), reclaim=lambda: calls.append("reclaim"))
    lease.begin_wait()
    lease.begin_wait()  # a second sub_rlm of the same run while the first waits
    lease.end_wait()
    assert calls == ["lend"]
    lease.end_wait()
    assert calls == ["lend", "reclaim"]
    lease.begin_wait()
    assert calls == ["lend", "reclaim", "lend"]


def test_a_cancel_runs_hooks_once_and_a_hook_added_after_runs_at_once() -> None:
    flag = CancelFlag()
    seen: list[str] = []
    release = flag.on_set(lambda: seen.append("first"))
    gone = flag.on_set(lambda: seen.append("released"))
    gone()
    flag.set("user")
    flag.set("again")
    assert (seen, flag.reason, flag.is_set) == (["first"], "user", True)
    flag.on_set(lambda: seen.append("late"))
    assert seen == ["first", "late"]
    release()


def test_ids_are_derived_subject_tokens_that_differ_by_every_part() -> None:
    runs = {
        root_run_id("t", "s", "turn-1"),
        root_run_id("t", "s", "turn-2"),
        root_run_id("t", "s2", "turn-1"),
        tree_id("t", "s", "turn-1"),
        child_run_id("parent", "call", 0),
        child_run_id("parent", "call", 1),
        child_run_id("parent", "call2", 0),
    }
    assert len(runs) == 7
    for run in runs:
        assert check_id("run", run) == run
    assert root_run_id("t", "s", "turn-1") == root_run_id("t", "s", "turn-1")
