"""The budget-aware LM: every model call of a tree asks the budget service first.

dspy 3.4.1 deprecates `BaseLM.forward` subclasses in favour of engines (`complete(Request) ->
Response`), so this is a pair of dspy engines behind an ordinary `dspy.LM`. For each call:

1. resolve the role's profile and its key *now* (a rotated key or a changed profile applies to
   the next call on every replica);
2. ask `budget.grant` under the client rule of docs/budget.md, saying whether this is a run's own
   step (bounded by `max_iters`) or a sub call (bounded by `max_llm_calls`); a refusal raises
   `BudgetSpent`, whose message ("budget spent: ...") the model can read and act on (the first
   attempt's grant follows the lookup in the same trip to the runner's loop);
3. call the model through LiteLLM with the profile's address, key, timeout, limits and seed, in
   the fields its server honours (`fleet_agent.llm_wire`); with `on_delta` given, a reply that
   carries an `answer` field is streamed and that field's text handed to `on_delta` as it
   arrives (`fleet_agent.answer_stream`): the run publishes it on the session's live subject,
   while the recorded call still holds the whole response; with `announce` given, a granted
   call says so before it is sent (an `llm_call_started` delta naming its grant, role and
   model), so a watcher shows the call in flight until its `LlmCalled` is stored;
4. record usage (`budget.usage`), failed calls included, at the profile's prices, and hand an
   `LlmCalled` event to `on_call` for the run engine to append; with `usage` (a run's
   `PendingUsage`) the report is sent and not waited for: the run's next grant, and its end,
   wait for it instead (`PendingUsage`);
5. a failed call raises `LmCallFailed` naming its kind (`fleet_agent.llm_failures`: the code,
   whether asking again may help, what to do), recorded as the call's `error_code`; a rate
   limit with a short `Retry-After` is asked again after that wait, as a call of its own
   (steps 2 to 4 again), at most `RATE_LIMIT_RETRIES` times and never past the run's deadline.

The key is passed to LiteLLM explicitly on every call, a placeholder when the profile has
none, so LiteLLM never falls back to a provider key in the host environment (which it would
then send to whatever `api_base` a profile names). Error text is scrubbed of the key before it
goes anywhere.
"""

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: never fetch the map

import dspy
import msgspec
import stamina
from dspy.clients.engines.litellm_engine import LiteLLMEngine
from dspy.clients.lm15_boundary import request_kwargs
from dspy.lm15 import Request, Response, materialize_response
from nats.errors import Error as NatsError

from fleet_agent.answer_stream import FieldStream
from fleet_agent.llm_failures import RATE_LIMIT_RETRIES, LlmFailure, classify, retry_wait
from fleet_agent.llm_wire import for_server, output_fields
from fleet_agent.lm_errors import (
    BudgetSpent,
    LmCallFailed,
    LmNotConfigured,
    LmWaitCancelled,
    call_site,
    retry_hook,
)
from fleet_agent.lm_usage import CallScope, LmServices, PendingUsage, RequestKind, Runner, Submit
from fleet_agent.run.failures import RunCancelledError
from fleet_agent.run.seams import in_own_thread
from fleet_events import bus
from fleet_events.addresses import AddressRefused
from fleet_events.budget import (
    ATTEMPT_TIMEOUT_S,
    CLIENT_DEADLINE_S,
    RETRYABLE_CODES,
    Grant,
    GrantReply,
    RecordUsage,
)
from fleet_events.bus import CALL_STARTED_DELTA, MODEL_WAITING_DELTA
from fleet_events.envelope import new_id
from fleet_events.llm import (
    STARTING,
    InvalidProfile,
    LlmProfile,
    LocalModelState,
    cost,
    local_state_line,
)
from fleet_events.run import ChatMessage, LlmCalled, request_digest
from fleet_mesh import egress, rpc
from fleet_mesh.runtime_config import ProfileNotFound, StoredProfile
from fleet_mesh.secrets import SecretError

OnDelta = Callable[[str, str], object]
"""`(kind, text)`: an unpersisted delta for the session's watchers (e.g. `RunRecorder.live`)."""

ANSWER_DELTA = "assistant_token"
"""The delta kind of the answer's text (the earlier system's name for it)."""
STREAMED_FIELD = "answer"

log = logging.getLogger("fleet.agent.lm")

LOCAL_BASE = "http://127.0.0.1:"
"""Where `fleet up` serves the embedded model; a profile elsewhere never reads its state (one
KV read fewer before every call of every other mesh)."""
LOCAL_WAIT_S = 1800.0
"""How long a call without a run deadline waits for the embedded model to come up."""
LOCAL_POLL_S = 2.0
"""How often a waiting call reads the embedded model's state."""
LOCAL_RETELL_S = 10.0
"""How often a waiting call says so again when nothing changed (deltas are not stored: a
watcher that came later learns it within this)."""

NO_KEY = "unused"
"""Sent as the key when a profile names no secret (a local server that checks none)."""


def scrub(text: str, secret: str | None) -> str:
    if secret and secret != NO_KEY and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text


def _messages(request: Request) -> tuple[list[ChatMessage], dict[str, Any]]:
    data = request_kwargs(request, "chat")
    messages = [
        ChatMessage(
            role=str(m.get("role", "")),
            content=m.get("content"),
            name=m.get("name"),
            tool_call_id=m.get("tool_call_id"),
            tool_calls=m.get("tool_calls"),
        )
        for m in data.pop("messages", [])
    ]
    return messages, data


def _text(response: Response) -> str:
    return "".join(getattr(part, "text", "") or "" for part in response.message.parts)


def _streams_answer(request: Request) -> bool:
    return any(name == STREAMED_FIELD for name, _ in output_fields(request))


def _with_profile_limits(request: Request, profile: LlmProfile) -> Request:
    """The request as it is sent and recorded: the profile's token cap and temperature, then
    its seed and its server's own fields (`llm_wire.for_server`). The journal LM computes the
    recorded digest from this same function, so a resumed call matches its record."""
    config = request.config
    if profile.max_tokens is not None and (
        config.max_tokens is None or config.max_tokens > profile.max_tokens
    ):
        config = dataclasses.replace(config, max_tokens=profile.max_tokens)
    if profile.temperature is not None and config.temperature is None:
        config = dataclasses.replace(config, temperature=profile.temperature)
    limited = request if config is request.config else dataclasses.replace(request, config=config)
    return for_server(limited, profile)


class BudgetedEngine:
    """dspy's sync engine protocol; safe to call from any thread but the runner's own."""

    def __init__(
        self,
        runner: Runner,
        services: LmServices,
        scope: CallScope,
        *,
        on_call: Callable[[LlmCalled], object] | None = None,
        on_delta: OnDelta | None = None,
        announce: OnDelta | None = None,
        checkpoint: Callable[[], None] | None = None,
        grant_id: Callable[[], str] = new_id,
        deadline_s: float = CLIENT_DEADLINE_S,
        run_deadline: float | None = None,
        usage: PendingUsage | None = None,
    ) -> None:
        """`deadline_s`: the budget client's deadline per request; `run_deadline`: the
        run's own (epoch seconds, None for none), which no retry waits past; `usage`: the
        run's reports in flight (None: each report is waited for before the answer returns)."""
        self.runner = runner
        self.services = services
        self.scope = scope
        self.on_call = on_call
        self.on_delta = on_delta
        self.announce = announce
        self.checkpoint = checkpoint
        """Called while a call waits for the embedded model: raises to stop waiting (the run's
        cancel)."""
        self.grant_id = grant_id
        self.deadline_s = deadline_s
        self.run_deadline = run_deadline
        self.usage = usage

    # -- mesh steps, run on the runner's loop ----------------------------------------------

    async def _resolve(self) -> tuple[StoredProfile, str]:
        try:
            stored = await self.services.llm.resolve(self.scope.role, tenant=self.scope.tenant)
            secret = stored.profile.secret
            if secret is None:
                return stored, NO_KEY
            # the profile's own scope: a tenant profile never opens a global secret
            return stored, await self.services.secrets.get(secret, tenant=stored.tenant)
        except (ProfileNotFound, SecretError, InvalidProfile) as exc:
            raise LmNotConfigured(str(exc)) from None

    async def _grant(self, grant_id: str) -> GrantReply:
        request = Grant(
            request_id=grant_id,
            tree=self.scope.tree,
            run=self.scope.run,
            calls=1,
            kind=self.scope.kind,
        )
        try:
            return await rpc.call_verb_retrying(
                self.services.nc,
                bus.GRANT,
                request,
                attempt_timeout=ATTEMPT_TIMEOUT_S,
                deadline=self.deadline_s,
                retry_codes=RETRYABLE_CODES,
            )
        except rpc.NoFinalAnswer:
            # docs/budget.md rule 4: no final answer is a refusal; spend less, never more
            return GrantReply(
                granted=False,
                calls=1,
                remaining=0,
                reason="unavailable",
                message=f"budget spent: the budget service did not answer in {self.deadline_s}s",
            )

    async def _usage(self, usage: RecordUsage) -> None:
        await rpc.call_verb_retrying(
            self.services.nc,
            bus.RECORD_USAGE,
            usage,
            attempt_timeout=ATTEMPT_TIMEOUT_S,
            deadline=self.deadline_s,
            retry_codes=RETRYABLE_CODES,
        )

    def report(self, usage: RecordUsage) -> None:
        """Send a call's usage: waited for here, or left in flight in the run's `usage`."""
        if self.usage is None:
            self.runner.run(self._usage(usage), timeout=self.deadline_s + 5)
        else:
            self.usage.send(self._usage(usage))

    # -- the engine protocol -------------------------------------------------------------------

    def complete(self, request: Request, *, retries_made: int = 0) -> Response:
        """`retries_made`: retries of this call a run before a resume already made (the
        record holds them); they count against `RATE_LIMIT_RETRIES` as if made here."""
        self._settle_usage()
        stored, api_key, first = self.runner.run(
            self._resolve_and_grant(), timeout=30 + self.deadline_s + 5
        )
        if first is None:  # the embedded model is on its way up: wait for it, then the grant
            self._wait_for_local(stored)
            first = self._granted()
        request = _with_profile_limits(request, stored.profile)
        attempts = max(1, RATE_LIMIT_RETRIES + 1 - retries_made)
        for attempt in stamina.retry_context(on=retry_hook, attempts=attempts, timeout=None):
            with attempt:  # attempt.num counts from 1: the retries made before this one
                granted = first if attempt.num == 1 else self._granted()
                retries = retries_made + attempt.num - 1
                return self._attempt(
                    request, stored.profile, api_key, retries, granted,
                    tenant_scoped=stored.tenant is not None,
                )  # fmt: skip
        raise AssertionError("unreachable: stamina re-raises the last attempt's error")

    async def _resolve_and_grant(
        self,
    ) -> tuple[StoredProfile, str, tuple[str, GrantReply] | None]:
        """The profile and key, then the first attempt's grant, in one trip to the runner's
        loop: each trip from dspy's thread is a hop there and back, a millisecond or more on
        a loaded machine. A role with no usable profile still asks for no grant; one whose
        server is the embedded model still starting asks for none yet (None)."""
        stored, api_key = await self._resolve()
        if await self._local_starting(stored) is not None:
            return stored, api_key, None
        grant_id = self.grant_id()
        return stored, api_key, (grant_id, await self._grant(grant_id))

    async def _local_starting(self, stored: StoredProfile) -> LocalModelState | None:
        """The embedded model's state when the profile names its server and it is not up yet
        (installing, building, loading: `fleet up`'s first start on a machine)."""
        api_base = stored.profile.api_base
        if api_base is None or not api_base.startswith(LOCAL_BASE):
            return None  # `fleet up` serves the embedded model on loopback only: no read
        try:
            local = await self.services.llm.local_model()
        except (NatsError, TimeoutError) as exc:
            # the state is advice: unread (a server restarting), the call goes as it would
            log.warning("could not read the embedded model's state", extra={"error": repr(exc)})
            return None
        if local is None or local.api_base != stored.profile.api_base:
            return None
        if local.state in ("failed", "stopped"):  # it will not come up: say why, ask nothing
            detail = f"the local model is not up ({local_state_line(local)})"
            detail += f"; {local.advice}" if local.advice else ""
            site = call_site(stored.profile, self.scope.role)
            raise LmCallFailed("", LlmFailure(code="llm_unavailable", site=site, detail=detail))
        return local if local.state in STARTING else None

    def _wait_for_local(self, stored: StoredProfile) -> None:
        """Wait, within the run's deadline, until the embedded model is up; say so to the
        session's watchers (`model_waiting` deltas: what it is doing, how long it still
        needs). Past the deadline the call fails saying what the model is still doing."""
        deadline = self.run_deadline or time.time() + LOCAL_WAIT_S
        said, told_at = "", 0.0
        while True:
            if self.checkpoint is not None:
                try:
                    self.checkpoint()  # a cancelled turn stops waiting
                except RunCancelledError as exc:
                    raise LmWaitCancelled(str(exc)) from None
            local = self.runner.run(self._local_starting(stored), timeout=15)
            if local is None:
                return
            line = local_state_line(local)
            # said again now and then, changed or not: a page opened later learns it too
            if line != said or time.monotonic() - told_at >= LOCAL_RETELL_S:
                said, told_at = line, time.monotonic()
                self._tell(MODEL_WAITING_DELTA, f"waiting for the local model: {line}")
            left = deadline - time.time()
            if left <= 0:
                site = call_site(stored.profile, self.scope.role)
                detail = (
                    f"the local model is still starting ({line}) at this turn's deadline; send "
                    "it again once `fleet status` shows the llm up"
                )
                raise LmCallFailed("", LlmFailure(code="llm_unavailable", site=site, detail=detail))
            time.sleep(min(LOCAL_POLL_S, left))

    def _granted(self) -> tuple[str, GrantReply]:
        """A retry's own grant, after the failed attempt's usage report is in."""
        self._settle_usage()
        grant_id = self.grant_id()
        return grant_id, self.runner.run(self._grant(grant_id), timeout=self.deadline_s + 5)

    def _settle_usage(self) -> None:
        if self.usage is not None:
            self.usage.settle()  # the ledger holds every earlier call's usage before a grant

    def _attempt(
        self,
        request: Request,
        profile: LlmProfile,
        api_key: str,
        retries: int,
        granted: tuple[str, GrantReply],
        *,
        tenant_scoped: bool = False,
    ) -> Response:
        """One granted, recorded provider call; a failure raises `LmCallFailed`.
        `tenant_scoped`: the profile is a tenant's, whose address must be public."""
        grant_id, reply = granted
        if not reply.granted:
            message = reply.message or f"budget spent: {reply.reason or 'grant refused'}"
            if not message.startswith("budget spent"):
                message = f"budget spent: {message}"
            raise BudgetSpent(message)
        messages, params = _messages(request)
        self._announce(grant_id, profile.model)
        started = time.monotonic()
        response: Response | None = None
        error = ""
        failure: LlmFailure | None = None
        answered = _Answered()
        bound = CallBound.of(request, profile.timeout_s, started)
        try:
            if tenant_scoped and profile.api_base is not None:
                # a tenant's address is called only while it resolves to public addresses:
                # checked at every call, not only when stored (a name can change its answer)
                egress.check(profile.api_base)
            engine = LiteLLMEngine(
                api_key=api_key,
                api_base=profile.api_base,
                timeout=profile.timeout_s,
                wire_model=profile.model,
            )
            streams = self.on_delta is not None and _streams_answer(request)
            on_delta = self.on_delta if streams else None
            # always streamed: the product bounds each call's output and time itself, and a
            # call it gives up on is closed, so the server stops generating for no one
            response = self._streamed(engine, request, on_delta, answered, bound)
        except CallCut as exc:
            error = str(exc)
            failure = LlmFailure(
                code=exc.code, site=call_site(profile, self.scope.role), detail=str(exc)
            )
            answered.tokens = exc.tokens
        except AddressRefused as exc:  # nothing was sent
            error = str(exc)
            failure = LlmFailure(
                code="llm_bad_request", site=call_site(profile, self.scope.role), detail=str(exc)
            )
        except Exception as exc:
            error = scrub(f"{type(exc).__name__}: {exc}", api_key)
            failure = classify(exc, call_site(profile, self.scope.role))
        latency_ms = (time.monotonic() - started) * 1000
        wait = None
        if failure is not None and not answered.any:  # a half-streamed answer is not re-asked
            left = None if self.run_deadline is None else self.run_deadline - time.time()
            wait = retry_wait(failure, retries, left)
        prompt = (response.usage.input_tokens or 0) if response else 0
        # a call cut short still cost what it generated before the cut
        completion = (response.usage.output_tokens or 0) if response else answered.tokens
        spent = cost(profile.prices, prompt, completion)
        self.report(
            RecordUsage(
                request_id=f"{grant_id}-usage",
                tree=self.scope.tree,
                run=self.scope.run,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cost=spent,
                model=profile.model,
                role=self.scope.role,
            )
        )
        raised = None if response is not None else LmCallFailed(error, failure, wait or 0.0)
        if self.on_call is not None:
            self.on_call(
                LlmCalled(
                    role=self.scope.role,
                    model=profile.model,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    cost=spent,
                    latency_ms=round(latency_ms, 3),
                    request_kind=self.scope.kind,
                    grant_id=grant_id,
                    messages=messages,
                    params=params,
                    response=_text(response) if response else "",
                    request_hash=request_digest(profile.model, messages, params),
                    error=error,
                    error_code=failure.code if failure else "",
                    retry_in_s=wait or 0.0,
                    http_status=(failure.status or 0) if failure else 0,
                    retry_after_s=failure.retry_after_s if failure else None,
                    error_shown=str(raised) if raised is not None else "",
                )
            )
        if raised is not None:
            if failure is not None:
                log.warning(
                    "model call failed",
                    extra={"code": failure.code, "profile": profile.name, "retry_in_s": wait},
                )
            raise raised
        assert response is not None
        return response

    def _announce(self, grant_id: str, model: str) -> None:
        """Tell watchers the call is in flight."""
        text = msgspec.json.encode({"grant": grant_id, "role": self.scope.role, "model": model})
        self._tell(CALL_STARTED_DELTA, text.decode())

    def _tell(self, kind: str, text: str) -> None:
        """A delta for the session's watchers; a watcher missing it costs the call nothing."""
        if self.announce is None:
            return
        try:
            self.announce(kind, text)
        except Exception as exc:  # the bus is down: the call itself says so when it fails
            log.warning("could not tell the session's watchers", extra={"error": str(exc)})

    def _streamed(
        self, engine: LiteLLMEngine, request: Request, on_delta: OnDelta | None,
        answered: "_Answered", bound: "CallBound",
    ) -> Response:  # fmt: skip
        """The whole response, assembled from the stream while the answer's text goes out
        (`on_delta`, when the call streams an answer field); `bound` is checked at every
        delta, and a call past it is cut (`CallCut`): raising here closes the stream, and
        with it the request, so the server stops generating."""
        field = FieldStream(STREAMED_FIELD)

        def send(text: str) -> None:
            if not text or on_delta is None:
                return
            answered.any = True
            try:
                on_delta(ANSWER_DELTA, text)
            except Exception:  # a preview lost is a preview lost; the call goes on
                log.warning("an answer delta could not be published", exc_info=True)

        def tapped(events: Any) -> Any:
            try:
                for event in events:
                    if event.type == "delta" and getattr(event.delta, "type", "") == "text":
                        answered.tokens += 1
                        bound.check(answered.tokens)
                        send(field.feed(event.delta.text or ""))
                    yield event
                send(field.finish())
            finally:
                # a cut raised here leaves the engine's stream suspended, its connection
                # open and the server generating; closing it closes the request now
                close = getattr(events, "close", None)
                if close is not None:
                    close()

        return materialize_response(tapped(engine.stream(request)), request)

    def stream(self, request: Request) -> Any:
        raise LmCallFailed(
            "the budgeted LM streams its answer to on_delta inside complete(); dspy's own "
            "stream path is not served"
        )

    def close(self) -> None:
        pass


class _Answered:
    """Whether any of the answer went out as a delta (a call that did is not asked again),
    and how many text deltas (about one a token: what a server streams) came in."""

    any = False
    tokens = 0


class CallCut(Exception):
    """The product cut a model call short: past its output-token bound, or past its time."""

    def __init__(self, code: str, message: str, tokens: int) -> None:
        super().__init__(message)
        self.code = code
        self.tokens = tokens


@dataclasses.dataclass(frozen=True)
class CallBound:
    """What one call may take, enforced here whatever the server honours (the embedded
    llama.cpp server went 694 to 2,158 tokens past a 512-token bound): at most `max_tokens`
    output tokens, and nothing after `timeout_s` from `started` (monotonic)."""

    max_tokens: int | None
    timeout_s: float
    started: float

    @classmethod
    def of(cls, request: Request, timeout_s: float, started: float) -> "CallBound":
        config = request.config
        limit = config.max_tokens
        if limit is None:  # llama.cpp's own field (`llm_wire.for_server`)
            extra = (config.extensions or {}).get("max_tokens")
            limit = extra if isinstance(extra, int) else None
        return cls(max_tokens=limit, timeout_s=timeout_s, started=started)

    def check(self, tokens: int) -> None:
        if self.max_tokens is not None and tokens > self.max_tokens:
            raise CallCut(
                "llm_error",
                f"the model went past the call's bound of {self.max_tokens} output tokens "
                f"({tokens} streamed): the request was closed so the server stops; the server "
                "does not honour max_tokens (for llama.cpp set server_kind 'llama.cpp' on the "
                "profile) or the bound is too low for the answer",
                tokens,
            )
        elapsed = time.monotonic() - self.started
        if elapsed > self.timeout_s:
            rate = tokens / elapsed if elapsed > 0 else 0.0
            raise CallCut(
                "llm_timeout",
                f"the model call ran past the profile's timeout of {self.timeout_s:g} s: "
                f"{tokens} tokens in {elapsed:.1f} s ({rate:.1f} tokens/s); the request was "
                "closed so the server stops generating for no one. Raise timeout_s of the "
                "profile, lower max_tokens, or use a faster model",
                tokens,
            )


class AsyncBudgetedEngine:
    """dspy's async engine protocol over the sync one, in a thread of its own (the sync
    engine waits on the runner's loop, which may be the caller's: `run.seams`)."""

    def __init__(self, sync: BudgetedEngine) -> None:
        self.sync = sync

    async def complete(self, request: Request) -> Response:
        return await in_own_thread(self.sync.complete, request)

    def stream(self, request: Request) -> Any:
        return self.sync.stream(request)

    async def aclose(self) -> None:
        pass


def budgeted_lm(
    runner: Runner,
    services: LmServices,
    scope: CallScope,
    *,
    on_call: Callable[[LlmCalled], object] | None = None,
    on_delta: OnDelta | None = None,
    announce: OnDelta | None = None,
    checkpoint: Callable[[], None] | None = None,
    grant_id: Callable[[], str] = new_id,
    run_deadline: float | None = None,
    usage: PendingUsage | None = None,
) -> Any:
    """A `dspy.LM` whose every call is granted, made with the role's profile, and recorded.

    Its model label (`openai/fleet-<role>`) only names it in dspy's history: the model called
    is the profile's, read at each call. dspy's cache and retries are off, so every call is
    one grant and one provider call. With `on_delta`, the answer field's text of a reply that
    has one goes to it as it streams in (`assistant_token` deltas); with `announce`, each
    granted call is announced to it before it is sent (`llm_call_started`).
    """
    engine = BudgetedEngine(
        runner, services, scope, on_call=on_call, on_delta=on_delta, announce=announce,
        checkpoint=checkpoint, grant_id=grant_id, run_deadline=run_deadline, usage=usage,
    )  # fmt: skip
    return dspy.LM(
        f"openai/fleet-{scope.role}",
        engine=engine,
        async_engine=AsyncBudgetedEngine(engine),
        cache=False,
        num_retries=0,
    )


__all__ = [
    "ANSWER_DELTA",
    "CALL_STARTED_DELTA",
    "NO_KEY",
    "AsyncBudgetedEngine",
    "BudgetSpent",
    "BudgetedEngine",
    "CallScope",
    "LmCallFailed",
    "LmNotConfigured",
    "LmServices",
    "OnDelta",
    "PendingUsage",
    "RequestKind",
    "Runner",
    "Submit",
    "budgeted_lm",
    "call_site",
    "retry_hook",
    "scrub",
]
