"""The REPL verbs: open and close a context, run a cell, interrupt a running cell. A cell's
host tool calls are relayed to the interpreter owning its context."""

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from fleet_events import bus
from fleet_events import sandbox as sb
from fleet_events.ids import InvalidId, check_id
from fleet_mesh import rpc
from fleet_mesh.blobs import BlobNotFound
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.broker import Broker, Held
from fleet_sandbox_broker.errors import BadSpec, ContextNotOpen, SandboxStopped
from fleet_sandbox_broker.providers.base import OutputSink, StreamsOutput, ToolRelay

# room for the reply's own fields and the NATS headers around a capped execution reply
REPLY_MARGIN = 4096
TOOL_REACH_S = 15.0
"""How long a host tool call met by "no responders" is sent again: the agent holding the
interpreter reconnecting after a NATS restart has no subscription for a moment."""
_encode = msgspec.json.Encoder().encode


class Repl:
    def __init__(self, broker: Broker, reply_budget: int) -> None:
        self.b = broker
        self.reply_budget = reply_budget

    def _context(self, req: sb.Execute | sb.InterruptCell) -> Held:
        held = self.b.get_held(req.tenant, req.sandbox)
        if req.context not in held.interpreters:
            raise ContextNotOpen(f"no open context {req.context!r} in sandbox {req.sandbox!r}")
        return held

    async def open_context(self, req: sb.OpenContext) -> sb.Ack:
        held = self.b.get_held(req.tenant, req.sandbox)
        try:
            check_id("context", req.context)
            if req.interpreter is not None:
                check_id("interpreter", req.interpreter)
        except InvalidId as exc:
            raise BadSpec(str(exc)) from exc
        await held.box.open_context(req.context)
        held.interpreters[req.context] = req.interpreter
        event = domain.context_opened(req.sandbox, req.context, req.interpreter)
        await self.b.append(req.tenant, req.sandbox, event, held.labels)
        return sb.Ack()

    async def close_context(self, req: sb.CloseContext) -> sb.Ack:
        held = self.b.get_held(req.tenant, req.sandbox)
        if held.interpreters.pop(req.context, "absent") == "absent":
            return sb.Ack(ok=False)
        await held.box.close_context(req.context)
        event = domain.context_closed(req.sandbox, req.context)
        await self.b.append(req.tenant, req.sandbox, event, held.labels)
        return sb.Ack()

    async def execute(self, req: sb.Execute) -> sb.ExecuteReply:
        held = self._context(req)
        interpreter = held.interpreters[req.context]
        blobs = dict(req.blobs)
        for digest, ref in req.blob_refs.items():
            if ref.sha256 != digest:
                raise BadSpec(f"blob {ref.object} does not hold variable {digest}")
            try:
                blobs[digest] = (await self.b.blobs.get(req.tenant, ref.sha256)).decode()
            except BlobNotFound as exc:
                raise BadSpec(f"variable {digest} is not in the object store: {exc}") from exc
        limit = held.box.limits.wall_s
        wall = limit if req.wall_s is None else min(req.wall_s, limit)
        relay = self._relay_to(interpreter, req.callback_timeout_s)
        box = held.box
        try:
            if isinstance(box, StreamsOutput) and interpreter is not None:
                reply = await box.execute(
                    context=req.context, code=req.code, variables=req.variables, blobs=blobs,
                    tools=req.tools, output_fields=req.output_fields, wall_s=wall, relay=relay,
                    on_output=self._output_to(interpreter, req.sandbox, req.context),
                )  # fmt: skip
            else:
                reply = await box.execute(
                    context=req.context, code=req.code, variables=req.variables, blobs=blobs,
                    tools=req.tools, output_fields=req.output_fields, wall_s=wall, relay=relay,
                )  # fmt: skip
        except SandboxStopped as exc:
            return sb.ExecuteReply(kind="terminal", error=exc.message)
        return domain.fit_reply(reply, self.reply_budget - REPLY_MARGIN)

    async def interrupt(self, req: sb.InterruptCell) -> sb.Interrupted:
        """Stop the cell running in the context now; the sandbox and its REPL state survive."""
        held = self._context(req)
        return sb.Interrupted(interrupted=await held.box.interrupt(req.context))

    def _output_to(self, interpreter: str, sandbox: str, context: str) -> OutputSink:
        """A running cell's output, published (core NATS, no reply) to the interpreter that
        owns its context: unpersisted, and lost if nobody listens, as a preview may be."""
        nc = self.b.ctx.nc
        subject = bus.cell_output_subject(interpreter)
        seq = 0

        async def publish(text: str) -> None:
            nonlocal seq
            seq += 1
            chunk = sb.CellOutput(sandbox=sandbox, context=context, text=text, seq=seq)
            await nc.publish(subject, _encode(chunk))

        return publish

    def _relay_to(self, interpreter: str | None, timeout: float) -> ToolRelay:
        nc = self.b.ctx.nc

        async def relay(call: sb.ToolCall) -> sb.ToolReply:
            if interpreter is None:
                return sb.ToolReply(ok=False, error="this context has no interpreter for tools")
            try:
                return await rpc.call_verb_reaching(
                    nc, bus.TOOL_CALL, call, target=interpreter, timeout=timeout,
                    reach_s=TOOL_REACH_S,
                )  # fmt: skip
            except (TimeoutError, NatsTimeout):
                return sb.ToolReply(
                    ok=False, error=f"host tool {call.name!r} did not answer within {timeout:g} s"
                )
            except NoRespondersError:
                return sb.ToolReply(
                    ok=False,
                    error=f"the interpreter owning this context is gone ({TOOL_REACH_S:g} s "
                    "without a subscriber)",
                )
            except rpc.RemoteError as exc:
                return sb.ToolReply(ok=False, error=exc.message)

        return relay
