// The reducer. `fold` is pure to its callers: it never changes the view it is given, and
// shares every entity a batch did not touch (so React sees new references only where
// something changed). Inside one batch it copies each touched object once, which keeps a
// 10,000-event replay linear instead of copying the whole model per event.
import type { DeltaFrame, EventFrame } from "./frames";
import type { Budget, InFlightCall, Iteration, RunNode, Turn, ViewModel } from "./view";
import { EARLY_RUNS, emptyView } from "./view";

class Draft {
  private readonly fresh = new WeakSet<object>();
  constructor(readonly v: ViewModel) {
    this.fresh.add(v);
  }

  own<T extends object>(value: T): T {
    if (this.fresh.has(value)) return value;
    const copy = (Array.isArray(value) ? [...value] : { ...value }) as T;
    this.fresh.add(copy);
    return copy;
  }

  runs(): Record<string, RunNode> {
    this.v.runs = this.own(this.v.runs);
    return this.v.runs;
  }

  run(id: string): RunNode | undefined {
    const found = this.v.runs[id];
    if (!found) return undefined;
    const mine = this.own(found);
    this.runs()[id] = mine;
    return mine;
  }

  turn(id: string | null | undefined): Turn | undefined {
    if (!id) return undefined;
    const index = this.v.turns.findLastIndex((t) => t.id === id);
    if (index < 0) return undefined;
    this.v.turns = this.own(this.v.turns);
    const mine = this.own(this.v.turns[index] as Turn);
    this.v.turns[index] = mine;
    return mine;
  }

  budget(tree: string): Budget | undefined {
    const found = this.v.budgets[tree];
    if (!found) return undefined;
    this.v.budgets = this.own(this.v.budgets);
    const mine = this.own(found);
    this.v.budgets[tree] = mine;
    return mine;
  }

  iteration(run: RunNode, index: number, seq: number): Iteration {
    run.iterations = this.own(run.iterations);
    let at = run.iterations.findIndex((it) => it.index === index);
    if (at < 0) {
      const it = { index, seq, reasoning: "", code: "", tool: "", cells: [], llmCalls: [] };
      run.iterations.push(it);
      run.iterations.sort((a, b) => a.index - b.index);
      at = run.iterations.findIndex((it) => it.index === index);
    }
    const mine = this.own(run.iterations[at] as Iteration);
    run.iterations[at] = mine;
    return mine;
  }

  notice(seq: number, kind: string, text: string): void {
    this.v.notices = this.own(this.v.notices);
    this.v.notices.push({ seq, kind, text });
  }
}

function newTurn(id: string, seq: number, message = "", mode = ""): Turn {
  return {
    id,
    message,
    mode,
    status: "requested",
    answer: "",
    streaming: "",
    streamSealed: false,
    error: "",
    fallback: "",
    waiting: "",
    seq,
    rootRun: null,
  };
}

function apply(d: Draft, frame: EventFrame): void {
  const v = d.v;
  const env = frame.event;
  const data = env.data;
  const seq = frame.seq;
  switch (data.type) {
    case "session.created":
      v.session = { id: env.session ?? null, title: data.title ?? "", deleted: false };
      return;
    case "session.renamed":
      v.session = { ...v.session, title: data.title };
      return;
    case "session.deleted":
      v.session = { ...v.session, deleted: true };
      return;
    case "turn.requested": {
      if (!env.turn || d.turn(env.turn)) return;
      v.turns = d.own(v.turns);
      v.turns.push(newTurn(env.turn, seq, data.message, data.mode ?? "auto"));
      return;
    }
    case "turn.started": {
      const turn = d.turn(env.turn);
      if (turn) turn.status = "running";
      return;
    }
    case "turn.parked": {
      const turn = d.turn(env.turn);
      if (turn) turn.status = "parked";
      return;
    }
    case "turn.completed": {
      const turn = d.turn(env.turn);
      if (!turn) return;
      turn.status = "completed";
      turn.answer = data.answer;
      turn.fallback = data.fallback ?? "";
      turn.streaming = "";
      turn.waiting = "";
      return;
    }
    case "turn.failed": {
      const turn = d.turn(env.turn);
      if (!turn) return;
      turn.status = "failed";
      turn.error = data.code ? `${data.code}: ${data.error}` : data.error;
      turn.streaming = "";
      turn.waiting = "";
      return;
    }
    case "turn.cancelled": {
      const turn = d.turn(env.turn);
      if (!turn) return;
      turn.status = "cancelled";
      turn.answer = data.partial ?? "";
      turn.error = data.reason ? `cancelled: ${data.reason}` : "cancelled";
      turn.streaming = "";
      turn.waiting = "";
      return;
    }
    case "turn.refused": {
      let turn = d.turn(env.turn);
      if (!turn && env.turn) {
        v.turns = d.own(v.turns);
        turn = newTurn(env.turn, seq);
        v.turns.push(turn);
      }
      if (!turn) return;
      turn.status = "refused";
      turn.error = `${data.reason}: ${data.message}`;
      return;
    }
    case "input.requested":
      v.pendingInput = {
        requestId: data.request_id,
        turn: env.turn ?? null,
        question: data.question,
        options: [...(data.options ?? [])],
      };
      return;
    case "input.provided":
    case "input.expired":
      if (v.pendingInput?.requestId === data.request_id) v.pendingInput = null;
      return;
    case "input.refused":
      d.notice(seq, "input_refused", `${data.reason}: ${data.message}`);
      return;
    case "session.restored":
      d.notice(seq, "restored", `restored to sequence ${data.upto_seq ?? "end"}`);
      return;
    case "session.imported":
      d.notice(seq, "imported", `imported from ${data.source_session || "an export"}`);
      return;
    case "run.started": {
      const id = env.run;
      if (!id || v.runs[id]) return;
      const parent = env.parent_run ?? null;
      d.runs()[id] = {
        id,
        parent,
        turn: env.turn ?? null,
        tree: data.tree,
        kind: data.kind,
        depth: data.depth ?? 0,
        task: data.task ?? "",
        status: "running",
        answer: "",
        error: "",
        iterations: [],
        cells: [],
        llmCalls: [],
        children: [],
        maxLlmCalls: data.max_llm_calls ?? 0,
        liveStdout: "",
        inFlight: v.early[id] ?? [], // announced before the log said the run started
        seq,
      };
      if (v.early[id]) {
        const { [id]: _, ...rest } = v.early;
        v.early = rest;
      }
      v.runOrder = d.own(v.runOrder);
      v.runOrder.push(id);
      const up = parent ? d.run(parent) : undefined;
      if (up) {
        up.children = d.own(up.children);
        up.children.push(id);
      } else {
        const turn = d.turn(env.turn);
        if (turn && !turn.rootRun) turn.rootRun = id;
      }
      if (!v.budgets[data.tree]) {
        v.budgets = d.own(v.budgets);
        v.budgets[data.tree] = {
          tree: data.tree,
          maxLlmCalls: data.max_llm_calls ?? 0,
          maxDepth: 0,
          maxTokens: null,
          maxCost: null,
          callsUsed: 0,
          tokensUsed: 0,
          costUsed: 0,
        };
      }
      return;
    }
    case "run.iteration_planned": {
      const run = env.run ? d.run(env.run) : undefined;
      if (!run) return;
      const it = d.iteration(run, data.index, seq);
      it.reasoning = data.reasoning ?? "";
      it.code = data.code ?? "";
      it.tool = data.tool ?? "";
      // The step's own LM call came before its plan: move it under the iteration it planned.
      const call = data.llm_call;
      if (call && run.llmCalls.includes(call)) {
        run.llmCalls = run.llmCalls.filter((c) => c !== call);
        it.llmCalls = d.own(it.llmCalls);
        it.llmCalls.push(call);
      }
      return;
    }
    case "run.cell_executed": {
      const run = env.run ? d.run(env.run) : undefined;
      if (!run) return;
      if (data.setup) return; // the framework's set-up code: not a cell the model wrote
      const key = data.cell_id || `${run.id}#${seq}`;
      if (v.cells[key]) return;
      v.cells = d.own(v.cells);
      v.cells[key] = {
        key,
        run: run.id,
        iteration: data.iteration ?? null,
        code: data.code,
        stdout: data.stdout ?? "",
        error: data.error ?? "",
        durationMs: data.duration_ms ?? 0,
        final: data.final ?? null,
        seq,
      };
      v.cellOrder = d.own(v.cellOrder);
      v.cellOrder.push(key);
      run.liveStdout = "";
      if (data.iteration != null) {
        const it = d.iteration(run, data.iteration, seq);
        it.cells = d.own(it.cells);
        it.cells.push(key);
      } else {
        run.cells = d.own(run.cells);
        run.cells.push(key);
      }
      return;
    }
    case "run.llm_called": {
      const run = env.run ? d.run(env.run) : undefined;
      if (!run) return;
      const key = data.call_id || `${run.id}#${seq}`;
      if (v.llmCalls[key]) return;
      v.llmCalls = d.own(v.llmCalls);
      v.llmCalls[key] = {
        key,
        run: run.id,
        role: data.role,
        model: data.model,
        promptTokens: data.prompt_tokens ?? 0,
        completionTokens: data.completion_tokens ?? 0,
        cost: data.cost ?? 0,
        latencyMs: data.latency_ms ?? 0,
        error: data.error ?? "",
        cached: data.cached ?? false,
        prompt: Array.isArray(data.messages)
          ? data.messages.map((m) => ({
              role: m.role,
              content: typeof m.content === "string" ? m.content : JSON.stringify(m.content ?? ""),
            }))
          : data.messages
            ? null
            : [],
        reply: typeof data.response === "string" ? data.response : data.response ? null : "",
        grant: data.grant_id ?? "",
        seq,
      };
      if (data.grant_id && run.inFlight.some((c) => c.grant === data.grant_id))
        run.inFlight = run.inFlight.filter((c) => c.grant !== data.grant_id);
      v.llmOrder = d.own(v.llmOrder);
      v.llmOrder.push(key);
      // A sub-LM call made from a cell belongs to the iteration running that cell.
      const last = run.iterations.at(-1);
      if (data.cell && last) {
        const it = d.iteration(run, last.index, seq);
        it.llmCalls = d.own(it.llmCalls);
        it.llmCalls.push(key);
      } else {
        run.llmCalls = d.own(run.llmCalls);
        run.llmCalls.push(key);
      }
      const streamed = run.turn ? v.turns.find((t) => t.id === run.turn) : undefined;
      if (streamed?.streaming && !streamed.streamSealed) {
        const mine = d.turn(streamed.id);
        if (mine) mine.streamSealed = true;
      }
      const budget = d.budget(run.tree);
      if (budget && !data.cached) {
        budget.callsUsed += 1;
        budget.tokensUsed += (data.prompt_tokens ?? 0) + (data.completion_tokens ?? 0);
        budget.costUsed += data.cost ?? 0;
      }
      return;
    }
    case "run.tool_called":
      v.tools = d.own(v.tools);
      v.tools[data.call_id] = {
        callId: data.call_id,
        run: env.run ?? "",
        tool: data.tool,
        args: data.args ?? null,
        result: null,
        error: "",
        done: false,
        seq,
      };
      return;
    case "run.tool_returned": {
      const found = v.tools[data.call_id];
      if (!found) return;
      v.tools = d.own(v.tools);
      v.tools[data.call_id] = {
        ...found,
        result: data.result ?? null,
        error: data.error ?? "",
        done: true,
      };
      return;
    }
    case "run.completed": {
      const run = env.run ? d.run(env.run) : undefined;
      if (!run) return;
      run.status = "completed";
      run.answer = data.answer;
      run.inFlight = [];
      return;
    }
    case "run.failed": {
      const run = env.run ? d.run(env.run) : undefined;
      if (!run) return;
      run.status = "failed";
      run.error = data.reason ? `${data.reason}: ${data.error}` : data.error;
      run.inFlight = [];
      return;
    }
    case "run.cancelled": {
      const run = env.run ? d.run(env.run) : undefined;
      if (!run) return;
      run.status = "cancelled";
      run.answer = data.partial_answer ?? "";
      run.inFlight = [];
      return;
    }
    case "budget.tree_opened": {
      v.budgets = d.own(v.budgets);
      const known = v.budgets[data.tree];
      v.budgets[data.tree] = {
        tree: data.tree,
        callsUsed: known?.callsUsed ?? 0,
        tokensUsed: known?.tokensUsed ?? 0,
        costUsed: known?.costUsed ?? 0,
        maxLlmCalls: data.max_llm_calls,
        maxDepth: data.max_depth,
        maxTokens: data.max_tokens ?? null,
        maxCost: data.max_cost ?? null,
      };
      return;
    }
    case "blob.offloaded":
      d.notice(seq, "offloaded", `an offloaded ${data.of_type} event could not be read back`);
      return;
    default:
      return;
  }
}

/** Fold `frames` (in stream order) onto `view`. Frames at or below `view.seq` were folded
 * already (a resume that overlaps, a frame delivered twice) and change nothing. */
export function fold(view: ViewModel, frames: readonly EventFrame[]): ViewModel {
  if (!frames.some((f) => f.seq > view.seq)) return view;
  const d = new Draft({ ...view });
  for (const frame of frames) {
    if (frame.seq <= d.v.seq) continue;
    apply(d, frame);
    d.v.seq = frame.seq;
    d.v.events += 1;
  }
  return d.v;
}

/** A live delta: previewed on the run or turn it names until the stored event replaces it. */
/** The answer's streamed tokens (`fleet_agent.lm.ANSWER_DELTA`; `token` as older agents sent). */
export const ANSWER_DELTAS = new Set(["assistant_token", "token"]);
/** A granted model call about to be sent (`fleet_events.bus.CALL_STARTED_DELTA`). */
export const CALL_STARTED = "llm_call_started";
/** A model call waiting for the embedded model (`fleet_events.bus.MODEL_WAITING_DELTA`). */
export const MODEL_WAITING = "model_waiting";

function announced(text: string): InFlightCall | null {
  try {
    const c = JSON.parse(text) as Partial<InFlightCall> | null;
    if (!c || typeof c.grant !== "string" || !c.grant) return null;
    return { grant: c.grant, role: String(c.role ?? "?"), model: String(c.model ?? "?") };
  } catch {
    return null;
  }
}

/** An announcement for a run not folded yet, held until its `run.started` arrives. */
function holdEarly(d: Draft, runId: string, call: InFlightCall): ViewModel {
  const held = d.v.early[runId] ?? [];
  const early = { ...d.v.early, [runId]: [...held, call] };
  const runs = Object.keys(early);
  for (const old of runs.slice(0, Math.max(0, runs.length - EARLY_RUNS))) delete early[old];
  d.v.early = early;
  return d.v;
}

export function foldDelta(view: ViewModel, delta: DeltaFrame): ViewModel {
  const d = new Draft({ ...view });
  const run = delta.run ? d.run(delta.run) : undefined;
  if (delta.kind === "cell_output") {
    if (!run) return view;
    run.liveStdout += delta.text;
    return d.v;
  }
  if (delta.kind === MODEL_WAITING) {
    const turn = run?.status === "running" ? d.turn(run.turn ?? undefined) : undefined;
    if (turn?.status !== "running") return view;
    turn.waiting = delta.text;
    return d.v;
  }
  if (delta.kind === CALL_STARTED) {
    const call = announced(delta.text);
    if (!call || !delta.run) return view;
    if (!run) {
      // the run's start is still on its way: held until it lands
      if (view.early[delta.run]?.some((c) => c.grant === call.grant)) return view;
      return holdEarly(d, delta.run, call);
    }
    // shown until its stored call arrives; one already stored (or a run ended) is not in flight
    if (run.status !== "running") return view;
    const waited = d.turn(run.turn ?? undefined);
    if (waited?.waiting) waited.waiting = ""; // the model is up: the call is sent
    if (run.inFlight.some((c) => c.grant === call.grant)) return view;
    if (Object.values(view.llmCalls).some((c) => c.grant === call.grant)) return view;
    run.inFlight = [...run.inFlight, call];
    return d.v;
  }
  if (!ANSWER_DELTAS.has(delta.kind)) return view; // a kind this screen does not show
  const turnId = run?.turn ?? view.turns.findLast((t) => t.status === "running")?.id;
  const turn = d.turn(turnId);
  if (!turn) return view;
  turn.streaming = turn.streamSealed ? delta.text : turn.streaming + delta.text;
  turn.streamSealed = false;
  return d.v;
}

/** The session as it stood right after sequence `seq`: the time-travel view. `frames` must be
 * in stream order (as the socket and the export give them). */
export function viewAt(frames: readonly EventFrame[], seq: number): ViewModel {
  let lo = 0;
  let hi = frames.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if ((frames[mid] as EventFrame).seq <= seq) lo = mid + 1;
    else hi = mid;
  }
  return fold(emptyView(), frames.slice(0, lo));
}
