"""Reconciling after a restart never gives up while the broker runs, and says so each time it
fails (issue 8: the hand-written backoff stopped silently after 8 tries, leaving a dead
replica's workspaces on disk for good)."""

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from fleet_sandbox_broker import lifecycle


class FlakyView:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def caught_up(self, timeout: float) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"store unavailable ({self.calls})")

    def everyone(self) -> list[Any]:
        return []


async def test_reconcile_keeps_retrying_past_any_count_and_logs_each_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(lifecycle, "RETRY_WAIT_S", (0.001, 0.002))
    view = FlakyView(failures=12)  # more than the old loop's 8 tries
    log = logging.getLogger("test.reconcile")
    broker: Any = SimpleNamespace(view=view, held={}, ctx=SimpleNamespace(replica="r", log=log))
    with caplog.at_level(logging.ERROR, logger="test.reconcile"):
        await asyncio.wait_for(lifecycle.reconcile_until_done(broker), 30)
    assert view.calls == 13
    failures = [r for r in caplog.records if r.getMessage() == "reconcile failed; retrying"]
    assert len(failures) == 12
