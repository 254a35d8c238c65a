"""What a budgeted LM needs from the mesh and whose call it makes, and the usage reports of a
run that are in flight (`PendingUsage`): the parts of the budgeted LM (`fleet_agent.lm`) that
its callers build and share."""

import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from nats.aio.client import Client

from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader

T = TypeVar("T")
RequestKind = Literal["step", "sub"]


class Runner(Protocol):
    """Runs a coroutine on the loop that owns the NATS connection (e.g. `SandboxBus`)."""

    def run(self, work: Coroutine[Any, Any, T], *, timeout: float) -> T: ...


Submit = Callable[[Coroutine[Any, Any, Any]], "concurrent.futures.Future[Any]"]
"""Starts a coroutine on the runner's loop without waiting for it (`SandboxBus.submit`)."""


class PendingUsage:
    """The usage reports of one run that are sent and not yet answered, shared by its LMs.

    A report is the ledger's durable append, one round trip the call's answer does not need:
    the answer goes back to dspy at once and the report overlaps what follows (the record,
    the relay into the sandbox, dspy's parsing). What the report guaranteed still holds because
    the run waits for every report in flight (`settle`) before its next grant and before its
    end: the ledger holds a call's usage before the run's next call is granted (the overshoot
    bound of docs/budget.md), a report that fails fails the next call or the run's end instead
    of vanishing, and a retry of a report is the same request (its id is the grant's), which
    the budget answers once. A report lost with its replica is sent again by the resumed run
    (`JournalEngine`)."""

    def __init__(self, submit: Submit, timeout_s: float) -> None:
        self._submit = submit
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._in_flight: list[concurrent.futures.Future[Any]] = []

    def send(self, report: Coroutine[Any, Any, Any]) -> None:
        future = self._submit(report)
        with self._lock:
            self._in_flight.append(future)

    def settle(self) -> None:
        """Wait for every report in flight; the first that failed raises here."""
        with self._lock:
            waiting, self._in_flight = self._in_flight, []
        failed: BaseException | None = None
        for future in waiting:
            try:
                future.result(self._timeout_s)
            except BaseException as exc:  # every report is waited for before one raises
                failed = failed or exc
        if failed is not None:
            raise failed


@dataclass(frozen=True)
class LmServices:
    """What an LM needs from the mesh, all bound to the runner's loop."""

    nc: Client
    llm: LlmConfig
    secrets: SecretsReader


@dataclass(frozen=True)
class CallScope:
    """Whose call this is: it is charged to `tree` on behalf of `run`."""

    tenant: str
    tree: str
    run: str
    role: str
    kind: RequestKind


__all__ = ["CallScope", "LmServices", "PendingUsage", "RequestKind", "Runner", "Submit"]
