// A long synthetic session for the fold benchmark.
import { Log } from "../src/model/fixtures";

export function bigSession(events: number): Log {
  const log = new Log();
  log.add({ type: "session.created", title: "bench" });
  let turn = 0;
  while (log.frames.length < events) {
    turn += 1;
    const t = { turn: `t${turn}` };
    const root = { turn: `t${turn}`, run: `r${turn}` };
    log.add({ type: "turn.requested", message: `question ${turn}` }, t);
    log.add({ type: "run.started", kind: "rlm", tree: `tree${turn}`, max_llm_calls: 50 }, root);
    for (let i = 0; i < 20 && log.frames.length < events; i++) {
      const call = `c${turn}_${i}`;
      log.add(
        { type: "run.llm_called", role: "main", model: "m", call_id: call, prompt_tokens: 100 },
        root,
      );
      log.add({ type: "run.iteration_planned", index: i, code: "print(1)", llm_call: call }, root);
      log.add(
        {
          type: "run.cell_executed",
          cell_id: `k${turn}_${i}`,
          iteration: i,
          code: "print(1)",
          stdout: "1\n",
        },
        root,
      );
    }
    log.add({ type: "run.completed", answer: "done" }, root);
    log.add({ type: "turn.completed", answer: "done" }, t);
  }
  return log;
}

/** One turn of `events` events, as a long recursive turn streams them: a root run planning,
 * calling the LM and running cells (each different, as real ones are), with a child run every
 * 50 iterations doing the same. */
export function oneTurn(events: number): Log {
  const log = new Log();
  log.add({ type: "session.created", title: "bench turn" });
  log.add({ type: "turn.requested", message: "a long recursive task" }, { turn: "t1" });
  log.add({ type: "turn.started", replica: "agent-1" }, { turn: "t1" });
  const root = { turn: "t1", run: "r0" };
  log.add({ type: "run.started", kind: "rlm", tree: "tree1", max_llm_calls: 5000 }, root);
  let i = 0;
  let where: { turn: string; run: string; parent_run?: string } = root;
  while (log.frames.length < events - 2) {
    if (i % 50 === 49) {
      const child = { turn: "t1", run: `c${i}`, parent_run: "r0" };
      log.add({ type: "run.child_requested", child_run: child.run, task: `part ${i}` }, root);
      log.add(
        { type: "run.started", kind: "rlm", tree: "tree1", depth: 1, task: `part ${i}` },
        child,
      );
      where = child;
    }
    const call = `k${i}`;
    log.add(
      {
        type: "run.llm_called",
        role: "planner",
        model: "bench/model",
        call_id: call,
        prompt_tokens: 1000 + i,
        completion_tokens: 40,
        cost: 0.0001,
        latency_ms: 300,
      },
      where,
    );
    const code = `rows = data[${i}:${i + 10}]\nprint(len(rows), sum(r["n"] for r in rows))`;
    log.add({ type: "run.iteration_planned", index: i, code, llm_call: call }, where);
    log.add(
      {
        type: "run.cell_executed",
        cell_id: `cell${i}`,
        iteration: i,
        code,
        stdout: `10 ${i * 10}\n`,
        duration_ms: 4,
      },
      where,
    );
    if (where !== root && i % 50 === 5) {
      log.add({ type: "run.completed", answer: `part ${i} done` }, where);
      where = root;
    }
    i += 1;
  }
  log.add({ type: "run.completed", answer: "done" }, root);
  log.add({ type: "turn.completed", answer: "done" }, { turn: "t1" });
  return log;
}
