"""A set of child processes kept alive: restarted with backoff when they die, stopped in two
waves (services, then what they need). Plain asyncio over `children.Child`; it knows nothing of
NATS or services, so tests drive it in-process with stand-in children."""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from fleet_cli.children import Child, ChildSpec, ChildView

TICK_S = 0.1

log = logging.getLogger("fleet.up")


class Supervisor:
    def __init__(
        self,
        specs: Sequence[ChildSpec] = (),
        *,
        grace_s: float = 10.0,
        on_change: Callable[[list[ChildView]], None] = lambda _: None,
    ) -> None:
        self.children = [Child(spec) for spec in specs]
        self.grace_s = grace_s
        self._on_change = on_change
        self._shown: list[ChildView] = []

    def views(self) -> list[ChildView]:
        return [child.view() for child in self.children]

    def start(self) -> None:
        """Start every child not started yet."""
        for child in self.children:
            if child.process is None:
                self._start(child)
        self._show()

    def launch(self, *specs: ChildSpec) -> list[Child]:
        """Add children and start them now."""
        children = [Child(spec) for spec in specs]
        for child in children:
            self.children.append(child)
            self._start(child)
        self._show()
        return children

    def _start(self, child: Child) -> None:
        child.start()
        log.info("started %s (pid %s, log %s)", child.spec.name, child.pid, child.spec.log_path)

    def tick(self, now: float) -> None:
        """One look at every child: note deaths, restart those whose backoff is over."""
        for child in self.children:
            rc = child.exited(now)
            if rc is not None:
                assert child.restart_at is not None
                log.warning(
                    "%s exited with %s; restarting in %.1fs (log: %s)",
                    child.spec.name,
                    rc,
                    max(0.0, child.restart_at - now),
                    child.spec.log_path,
                )
            if child.due(now):
                child.restart()
                log.info(
                    "restarted %s (pid %s, restart #%d)", child.spec.name, child.pid, child.restarts
                )
        self._show()

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.tick(time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK_S)

    def stop(self) -> None:
        """Services first, then what they need (NATS): each wave gets SIGTERM at once, and
        whatever is left after the grace period gets SIGKILL."""
        for last in (False, True):
            wave = [child for child in self.children if child.spec.stop_last is last]
            for child in wave:
                child.terminate()
            deadline = time.monotonic() + self.grace_s
            for child in wave:
                rc = child.finish(deadline)
                log.info("stopped %s (exit %s)", child.spec.name, rc)
        self._show()

    def _show(self) -> None:
        views = self.views()
        if views != self._shown:
            self._shown = views
            self._on_change(views)
