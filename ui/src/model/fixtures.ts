// Hand-built frames shaped like the gateway's, for the reducer's tests and the benchmark.
import type { Envelope } from "../generated/events";
import type { EventData, EventFrame } from "./frames";

interface Where {
  turn?: string;
  run?: string;
  parent_run?: string;
}

export class Log {
  private seq = 0;
  readonly frames: EventFrame[] = [];
  constructor(readonly session = "s1") {}

  add(data: EventData, where: Where = {}): EventFrame {
    this.seq += 1;
    const event: Envelope = {
      id: `e${this.seq}`,
      tenant: "t1",
      actor: { service: "agent", replica: "a1" },
      ts: new Date(Date.UTC(2026, 0, 1, 0, 0, this.seq)).toISOString(),
      session: this.session,
      data,
      ...where,
    };
    const frame: EventFrame = {
      type: "event",
      seq: this.seq,
      subject: where.run
        ? `fleet.session.t1.${this.session}.run.${where.run}`
        : `fleet.session.t1.${this.session}.log`,
      hash: `h${this.seq}`,
      event,
    };
    this.frames.push(frame);
    return frame;
  }
}

/** One RLM turn with a child run: plan, LM calls, cells (one failing), a SUBMIT. */
export function recursiveTurn(): Log {
  const log = new Log();
  const t = { turn: "t1" };
  const root = { turn: "t1", run: "r1" };
  const child = { turn: "t1", run: "r2", parent_run: "r1" };
  log.add({ type: "session.created", title: "demo" });
  log.add({ type: "turn.requested", message: "sum the primes below 20", mode: "rlm_only" }, t);
  log.add({ type: "turn.started", replica: "agent-1" }, t);
  log.add({ type: "run.started", kind: "rlm", tree: "tree1", max_llm_calls: 10 }, root);
  log.add(
    {
      type: "run.llm_called",
      role: "main",
      model: "scripted/main",
      call_id: "c1",
      prompt_tokens: 100,
      completion_tokens: 20,
      cost: 0.01,
      latency_ms: 40,
    },
    root,
  );
  log.add(
    {
      type: "run.iteration_planned",
      index: 0,
      reasoning: "ask a child",
      code: "x = sub_rlm('primes')",
      llm_call: "c1",
    },
    root,
  );
  log.add({ type: "run.child_requested", child_run: "r2", task: "primes below 20" }, root);
  log.add({ type: "run.started", kind: "rlm", tree: "tree1", depth: 1, task: "primes" }, child);
  log.add(
    {
      type: "run.llm_called",
      role: "main",
      model: "scripted/main",
      call_id: "c2",
      prompt_tokens: 50,
      completion_tokens: 10,
      cost: 0.005,
      latency_ms: 30,
    },
    child,
  );
  log.add(
    {
      type: "run.iteration_planned",
      index: 0,
      code: "SUBMIT([2,3,5,7,11,13,17,19])",
      llm_call: "c2",
    },
    child,
  );
  log.add(
    {
      type: "run.cell_executed",
      cell_id: "k2",
      iteration: 0,
      code: "SUBMIT([2,3,5,7,11,13,17,19])",
      stdout: "",
      final: [2, 3, 5, 7, 11, 13, 17, 19],
    },
    child,
  );
  log.add({ type: "run.completed", answer: "[2, 3, 5, 7, 11, 13, 17, 19]" }, child);
  log.add(
    {
      type: "run.child_completed",
      child_run: "r2",
      answer: "[2, 3, 5, 7, 11, 13, 17, 19]",
      child_head_hash: "hc",
    },
    root,
  );
  log.add(
    {
      type: "run.cell_executed",
      cell_id: "k1",
      iteration: 0,
      code: "x = sub_rlm('primes')\nprint(sum(x))",
      stdout: "77\n",
      duration_ms: 12,
    },
    root,
  );
  log.add(
    {
      type: "run.cell_executed",
      cell_id: "k3",
      iteration: 1,
      code: "1/0",
      error: "ZeroDivisionError: division by zero",
    },
    root,
  );
  log.add({ type: "run.completed", answer: "77" }, root);
  log.add({ type: "turn.completed", answer: "77" }, t);
  return log;
}
