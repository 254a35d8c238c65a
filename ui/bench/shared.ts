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
