import { describe, expect, it } from "vitest";
import { bigSession } from "../../bench/shared";
import { Log, recursiveTurn } from "./fixtures";
import { fold, foldDelta, viewAt } from "./fold";
import { Timeline } from "./timeline";
import { buildTree, collapsedSet, treeKey, visibleRows } from "./tree";
import { EARLY_RUNS, emptyView } from "./view";

function deepFreeze<T>(value: T): T {
  if (value && typeof value === "object" && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const child of Object.values(value)) deepFreeze(child);
  }
  return value;
}

describe("fold", () => {
  it("folds a recursive turn into transcript, runs, cells, LLM calls and budget", () => {
    const view = fold(emptyView(), recursiveTurn().frames);
    expect(view.session).toEqual({ id: "s1", title: "demo", deleted: false });
    expect(view.turns).toHaveLength(1);
    expect(view.turns[0]).toMatchObject({
      id: "t1",
      message: "sum the primes below 20",
      mode: "rlm_only",
      status: "completed",
      answer: "77",
      rootRun: "r1",
    });
    expect(view.runOrder).toEqual(["r1", "r2"]);
    const root = view.runs.r1;
    expect(root?.children).toEqual(["r2"]);
    expect(root?.status).toBe("completed");
    expect(root?.llmCalls).toEqual([]); // c1 moved under the iteration it planned
    expect(root?.iterations.map((it) => [it.index, it.llmCalls, it.cells])).toEqual([
      [0, ["c1"], ["k1"]],
      [1, [], ["k3"]],
    ]);
    expect(view.runs.r2).toMatchObject({
      parent: "r1",
      depth: 1,
      answer: "[2, 3, 5, 7, 11, 13, 17, 19]",
    });
    expect(view.cells.k1?.stdout).toBe("77\n");
    expect(view.cells.k3?.error).toContain("ZeroDivisionError");
    expect(view.cells.k2?.final).toEqual([2, 3, 5, 7, 11, 13, 17, 19]);
    expect(view.llmOrder).toEqual(["c1", "c2"]);
    expect(view.llmCalls.c2).toMatchObject({
      model: "scripted/main",
      promptTokens: 50,
      latencyMs: 30,
    });
    expect(view.budgets.tree1).toMatchObject({ maxLlmCalls: 10, callsUsed: 2, tokensUsed: 180 });
    expect(view.budgets.tree1?.costUsed).toBeCloseTo(0.015);
    expect(view.seq).toBe(17);
    expect(view.events).toBe(17);
  });

  it("ignores frames it has folded already, so a resume that overlaps adds nothing", () => {
    const frames = recursiveTurn().frames;
    const once = fold(emptyView(), frames);
    const first = fold(emptyView(), frames.slice(0, 10));
    const resumed = fold(first, frames.slice(6)); // the reconnect re-sent 7..10
    expect(resumed).toEqual(once);
    expect(fold(once, frames)).toBe(once);
    expect(resumed.cellOrder).toEqual(["k2", "k1", "k3"]);
  });

  it("never changes the view it is given and shares what a batch did not touch", () => {
    const frames = recursiveTurn().frames;
    const before = deepFreeze(fold(emptyView(), frames.slice(0, 12)));
    const snapshot = JSON.stringify(before);
    const after = fold(before, frames.slice(12));
    expect(JSON.stringify(before)).toBe(snapshot);
    expect(after).not.toBe(before);
    expect(after.runs.r2).toBe(before.runs.r2); // r2 finished at seq 12: untouched since
    expect(after.runs.r1).not.toBe(before.runs.r1);
    expect(after.cells.k2).toBe(before.cells.k2);
  });

  it("time travel at every sequence equals the live view at that moment", () => {
    const frames = recursiveTurn().frames;
    let live = emptyView();
    for (const frame of frames) {
      live = fold(live, [frame]);
      expect(viewAt(frames, frame.seq)).toEqual(live);
    }
    expect(viewAt(frames, 0)).toEqual(emptyView());
    expect(viewAt(frames, 5).turns[0]?.status).toBe("running");
    expect(viewAt(frames, 5).cellOrder).toEqual([]);
    expect(viewAt(frames, 1e9)).toEqual(live);
  });

  it("previews streamed deltas until the stored event replaces them", () => {
    const log = recursiveTurn();
    const frames = log.frames;
    let view = fold(emptyView(), frames.slice(0, 13));
    view = foldDelta(view, { type: "delta", kind: "cell_output", run: "r1", text: "7" });
    view = foldDelta(view, { type: "delta", kind: "cell_output", run: "r1", text: "7\n" });
    expect(view.runs.r1?.liveStdout).toBe("77\n");
    view = foldDelta(view, { type: "delta", kind: "token", run: "r1", text: "7" });
    view = foldDelta(view, { type: "delta", kind: "token", run: "r1", text: "7" });
    expect(view.turns[0]?.streaming).toBe("77");
    expect(view.seq).toBe(13); // deltas carry no sequence
    view = fold(view, frames.slice(13, 14));
    expect(view.runs.r1?.liveStdout).toBe("");
    view = fold(view, frames.slice(14));
    expect(view.turns[0]?.streaming).toBe("");
    expect(view.turns[0]?.answer).toBe("77");
    expect(foldDelta(view, { type: "delta", kind: "cell_output", run: "nope", text: "x" })).toBe(
      view,
    );
  });

  it("streams assistant_token deltas; a stored call seals them; other kinds show nothing", () => {
    const log = new Log();
    log.add({ type: "session.created", title: "s" });
    log.add({ type: "turn.requested", message: "hi" }, { turn: "t1" });
    log.add({ type: "turn.started", replica: "a" }, { turn: "t1" });
    log.add({ type: "run.started", kind: "chat", tree: "tr" }, { turn: "t1", run: "c1" });
    let view = fold(emptyView(), log.frames);
    const delta = (kind: string, text: string) =>
      ({ type: "delta", kind, run: "c1", text }) as const;
    view = foldDelta(view, delta("assistant_token", "Hel"));
    view = foldDelta(view, delta("assistant_token", "lo"));
    expect(view.turns[0]?.streaming).toBe("Hello");
    expect(foldDelta(view, delta("reasoning_token", "hmm"))).toBe(view);
    // the call that streamed it is stored; a later call's answer replaces the preview
    log.add(
      { type: "run.llm_called", role: "planner", model: "m", call_id: "k1", prompt_tokens: 1 },
      { turn: "t1", run: "c1" },
    );
    view = fold(view, log.frames.slice(-1));
    expect(view.turns[0]?.streaming).toBe("Hello");
    view = foldDelta(view, delta("assistant_token", "Bye"));
    expect(view.turns[0]?.streaming).toBe("Bye");
    log.add({ type: "turn.completed", answer: "Bye" }, { turn: "t1" });
    view = fold(view, log.frames.slice(-1));
    expect([view.turns[0]?.answer, view.turns[0]?.streaming]).toEqual(["Bye", ""]);
  });

  it("keeps the fallback line of an answer a lower module gave, and none otherwise", () => {
    const log = new Log();
    log.add({ type: "session.created" });
    log.add({ type: "turn.requested", message: "count" }, { turn: "a" });
    const note = "answered by ReAct (the tools) after the RLM failed: timed out (llm_timeout)";
    log.add(
      { type: "turn.completed", answer: "23", answered_by: "react", fallback: note },
      { turn: "a" },
    );
    log.add({ type: "turn.requested", message: "again" }, { turn: "b" });
    log.add({ type: "turn.completed", answer: "23", answered_by: "rlm" }, { turn: "b" });
    const view = fold(emptyView(), log.frames);
    expect(view.turns.map((t) => t.fallback)).toEqual([note, ""]);
  });

  it("keeps the framework's set-up code out of the cells the model wrote", () => {
    const log = new Log();
    log.add({ type: "session.created" });
    log.add({ type: "turn.requested", message: "count" }, { turn: "a" });
    log.add({ type: "run.started", kind: "rlm", tree: "tr" }, { turn: "a", run: "r1" });
    log.add(
      { type: "run.cell_executed", code: '"""dspy facade"""', cell_id: "c0", setup: true },
      { turn: "a", run: "r1" },
    );
    log.add(
      { type: "run.cell_executed", code: "print(1)", cell_id: "c1", iteration: 0 },
      { turn: "a", run: "r1" },
    );
    const view = fold(emptyView(), log.frames);
    expect(view.cellOrder).toEqual(["c1"]);
  });

  it("shows refusals, failures, cancels and the pending question", () => {
    const log = new Log();
    log.add({ type: "session.created" });
    log.add({ type: "turn.requested", message: "hi" }, { turn: "a" });
    log.add(
      { type: "turn.refused", reason: "busy", message: "turn b is running", active_turn: "b" },
      { turn: "a" },
    );
    log.add({ type: "turn.requested", message: "go" }, { turn: "b" });
    log.add(
      {
        type: "input.requested",
        request_id: "q1",
        question: "which file?",
        options: ["a.py", "b.py"],
      },
      { turn: "b" },
    );
    let view = fold(emptyView(), log.frames);
    expect(view.turns[0]).toMatchObject({ status: "refused", error: "busy: turn b is running" });
    expect(view.pendingInput).toEqual({
      requestId: "q1",
      turn: "b",
      question: "which file?",
      options: ["a.py", "b.py"],
    });
    log.add({ type: "input.provided", request_id: "other", answer: "x" }, { turn: "b" });
    view = fold(view, log.frames);
    expect(view.pendingInput?.requestId).toBe("q1");
    log.add({ type: "input.provided", request_id: "q1", answer: "a.py" }, { turn: "b" });
    log.add({ type: "turn.cancelled", reason: "user", partial: "half" }, { turn: "b" });
    log.add({ type: "turn.requested", message: "again" }, { turn: "c" });
    log.add({ type: "turn.failed", error: "model unreachable", code: "lm_down" }, { turn: "c" });
    view = fold(view, log.frames);
    expect(view.pendingInput).toBeNull();
    expect(view.turns.map((t) => [t.id, t.status, t.answer, t.error])).toEqual([
      ["a", "refused", "", "busy: turn b is running"],
      ["b", "cancelled", "half", "cancelled: user"],
      ["c", "failed", "", "lm_down: model unreachable"],
    ]);
  });

  it("takes the tree's limits from budget.tree_opened when the feed carries it", () => {
    const log = recursiveTurn();
    log.add({
      type: "budget.tree_opened",
      tree: "tree1",
      tenant: "t1",
      max_llm_calls: 30,
      max_depth: 3,
    });
    const view = fold(emptyView(), log.frames);
    expect(view.budgets.tree1).toMatchObject({ maxLlmCalls: 30, maxDepth: 3, callsUsed: 2 });
  });
});

describe("trace tree", () => {
  it("nests turn → runs → iterations → calls and cells → child runs", () => {
    const view = fold(emptyView(), recursiveTurn().frames);
    const [turn] = buildTree(view);
    expect(turn?.id).toBe("turn:t1");
    const root = turn?.children[0];
    expect(root?.id).toBe("run:r1");
    // in the order they happened: the child ran between the root's two iterations
    expect(root?.children.map((c) => c.id)).toEqual(["iter:r1:0", "run:r2", "iter:r1:1"]);
    expect(root?.children[0]?.children.map((c) => c.id)).toEqual(["llm:c1", "cell:k1"]);
    expect(root?.children[2]?.children[0]).toMatchObject({ id: "cell:k3", status: "failed" });
    expect(root?.children[1]?.children[0]?.children.map((c) => c.id)).toEqual([
      "llm:c2",
      "cell:k2",
    ]);
  });

  it("walks by keyboard and folds collapsed branches out of the walk", () => {
    const roots = buildTree(fold(emptyView(), recursiveTurn().frames));
    const all = visibleRows(roots, new Set());
    expect(all.map((r) => r.node.id)).toEqual([
      "turn:t1",
      "run:r1",
      "iter:r1:0",
      "llm:c1",
      "cell:k1",
      "run:r2",
      "iter:r2:0",
      "llm:c2",
      "cell:k2",
      "iter:r1:1",
      "cell:k3",
    ]);
    expect(treeKey(all, "run:r1", "ArrowDown").focus).toBe("iter:r1:0");
    expect(treeKey(all, "iter:r1:0", "ArrowLeft")).toEqual({
      focus: "iter:r1:0",
      toggle: "iter:r1:0",
    });
    expect(treeKey(all, "llm:c1", "ArrowLeft").focus).toBe("iter:r1:0");
    expect(treeKey(all, "cell:k2", "End").focus).toBe("cell:k3");
    const folded = visibleRows(roots, new Set(["run:r1"]));
    expect(folded.map((r) => r.node.id)).toEqual(["turn:t1", "run:r1"]);
    expect(treeKey(folded, "run:r1", "ArrowRight")).toEqual({ focus: "run:r1", toggle: "run:r1" });
  });

  it("lists a fallback's steps below the failed child run that came first", () => {
    const log = new Log();
    log.add({ type: "session.created" });
    log.add({ type: "turn.requested", message: "count" }, { turn: "t" });
    const root = { turn: "t", run: "r" };
    log.add({ type: "run.started", kind: "rlm", tree: "x" }, root);
    log.add({ type: "run.iteration_planned", index: 0, code: "sub_rlm('a')" }, root);
    log.add(
      { type: "run.started", kind: "rlm", tree: "x", depth: 1 },
      { ...root, run: "kid", parent_run: "r" },
    );
    log.add({ type: "run.failed", error: "timed out" }, { ...root, run: "kid", parent_run: "r" });
    // the fallback's own call names no iteration: it hangs off the run, yet came last
    log.add({ type: "run.llm_called", role: "planner", model: "m", call_id: "late" }, root);
    log.add({ type: "run.cell_executed", code: "print(1)", cell_id: "k9" }, root);
    const [turn] = buildTree(fold(emptyView(), log.frames));
    expect(turn?.children[0]?.children.map((c) => c.id)).toEqual([
      "iter:r:0",
      "run:kid",
      "llm:late",
      "cell:k9",
    ]);
  });

  it("says a call waits for the local model until the call is sent or the turn ends", () => {
    const log = new Log();
    log.add({ type: "session.created" });
    log.add({ type: "turn.requested", message: "hi" }, { turn: "t" });
    log.add({ type: "turn.started", replica: "a" }, { turn: "t" });
    log.add({ type: "run.started", kind: "chat", tree: "x" }, { turn: "t", run: "r" });
    let view = fold(emptyView(), log.frames);
    const line = "waiting for the local model: building: qwen, ~9 min left (building: 40s)";
    view = foldDelta(view, { type: "delta", kind: "model_waiting", run: "r", text: line });
    expect(view.turns[0]?.waiting).toBe(line);
    expect(foldDelta(view, { type: "delta", kind: "model_waiting", run: "no", text: "x" })).toBe(
      view,
    );
    const sent = JSON.stringify({ grant: "r-g1", role: "planner", model: "qwen" });
    const after = foldDelta(view, {
      type: "delta",
      kind: "llm_call_started",
      run: "r",
      text: sent,
    });
    expect(after.turns[0]?.waiting).toBe(""); // up: the call went out
    log.add(
      { type: "turn.failed", error: "still starting", code: "llm_unavailable" },
      { turn: "t" },
    );
    expect(fold(view, log.frames.slice(-1)).turns[0]?.waiting).toBe("");
  });

  it("shows a call in flight from its announcement until its stored call ends it", () => {
    const log = new Log();
    log.add({ type: "session.created" });
    log.add({ type: "turn.requested", message: "hi" }, { turn: "t" });
    log.add(
      { type: "run.started", kind: "chat", tree: "x", max_llm_calls: 5 },
      { turn: "t", run: "r" },
    );
    let view = fold(emptyView(), log.frames);
    const started = (grant: string, run = "r") =>
      ({
        type: "delta",
        kind: "llm_call_started",
        run,
        text: JSON.stringify({ grant, role: "planner", model: "qwen" }),
      }) as const;
    view = foldDelta(view, started("r-g1"));
    expect(foldDelta(view, started("r-g1"))).toBe(view); // announced twice: shown once
    expect(foldDelta(view, { ...started("r-g2"), text: "{oops" })).toBe(view);
    const flying = () => buildTree(view)[0]?.children[0]?.children.at(-1);
    expect(flying()).toMatchObject({
      id: "flight:r-g1",
      kind: "llm",
      label: "planner · qwen · in flight",
      status: "running",
    });
    log.add(
      { type: "run.llm_called", role: "planner", model: "qwen", call_id: "c1", grant_id: "r-g1" },
      { turn: "t", run: "r" },
    );
    view = fold(view, log.frames.slice(-1));
    expect(view.runs.r?.inFlight).toEqual([]);
    expect(flying()?.id).toBe("llm:c1");
    expect(foldDelta(view, started("r-g1"))).toBe(view); // a late announcement of a stored call
    view = foldDelta(view, started("r-g2"));
    expect(view.runs.r?.inFlight.map((c) => c.grant)).toEqual(["r-g2"]);
    log.add({ type: "run.failed", error: "boom" }, { turn: "t", run: "r" });
    view = fold(view, log.frames.slice(-1));
    expect(view.runs.r?.inFlight).toEqual([]); // an ended run has nothing in flight
    expect(foldDelta(view, started("r-g3"))).toBe(view);
    // time travel never shows one: deltas are not in the log
    expect(viewAt(log.frames, log.frames.length).runs.r?.inFlight).toEqual([]);
  });

  it("holds a call announced before its run's start arrives, and shows it once the run starts", () => {
    // deltas travel over core NATS and outrun the log: a run's first call is often announced
    // before the page has folded its run.started
    const log = new Log();
    log.add({ type: "session.created" });
    log.add({ type: "turn.requested", message: "hi" }, { turn: "t" });
    const announce = (grant: string, run = "r") =>
      ({
        type: "delta",
        kind: "llm_call_started",
        run,
        text: JSON.stringify({ grant, role: "planner", model: "qwen" }),
      }) as const;
    let view = foldDelta(fold(emptyView(), log.frames), announce("r-g1"));
    expect(foldDelta(view, announce("r-g1"))).toBe(view); // twice: held once
    expect(view.runs.r).toBeUndefined();
    log.add(
      { type: "run.started", kind: "chat", tree: "x", max_llm_calls: 5 },
      { turn: "t", run: "r" },
    );
    view = fold(view, log.frames.slice(-1));
    expect(view.runs.r?.inFlight.map((c) => c.grant)).toEqual(["r-g1"]);
    expect(view.early).toEqual({});
    // runs that never start (another page's, a deleted session's) are held only so many
    for (let i = 0; i < EARLY_RUNS + 5; i++) view = foldDelta(view, announce(`g${i}`, `lost${i}`));
    expect(Object.keys(view.early)).toHaveLength(EARLY_RUNS);
    expect(view.early.lost0).toBeUndefined();
    expect(view.early[`lost${EARLY_RUNS + 4}`]?.[0]?.grant).toBe(`g${EARLY_RUNS + 4}`);
  });

  it("shows a run whose parent never appeared instead of hiding it", () => {
    const log = new Log();
    log.add({ type: "run.started", kind: "rlm", tree: "x" }, { run: "lost", parent_run: "gone" });
    expect(buildTree(fold(emptyView(), log.frames)).map((n) => n.id)).toEqual(["run:lost"]);
  });
});

describe("timeline", () => {
  it("equals viewAt at every sequence, whatever the checkpoint spacing", () => {
    const frames = bigSession(160).frames;
    // out of order on purpose: a jump back after a jump forward uses the same checkpoints
    const seqs = [0, ...frames.map((f) => f.seq).reverse()];
    const expected = new Map(seqs.map((seq) => [seq, viewAt(frames, seq)]));
    for (const every of [1, 7, 64, 1000]) {
      const line = Timeline.of(frames, every);
      for (const seq of seqs) expect(line.at(seq)).toEqual(expected.get(seq));
    }
  }, 60_000); // a bound for a loaded CI machine, not a speed claim (bench/ui.py measures)

  it("makes its checkpoints one at a time ahead of need, and is still equal to viewAt", () => {
    const frames = bigSession(200).frames;
    const line = Timeline.of(frames, 50);
    let steps = 0;
    while (line.warmStep()) steps += 1;
    expect(steps).toBe(Math.floor(frames.length / 50) - 1); // the last call made the last one
    expect(line.warmStep()).toBe(false);
    for (const seq of [1, 49, 50, 51, 150, frames.length])
      expect(line.at(seq)).toEqual(viewAt(frames, seq));
  });

  it("keeps its checkpoints over a longer feed and starts afresh over another one", () => {
    const log = recursiveTurn();
    const short = log.frames.slice(0, 10);
    const line = Timeline.of(short, 3);
    line.at(short.at(-1)?.seq ?? 0);
    const longer = line.extend(log.frames);
    expect(longer.at(log.frames.at(-1)?.seq ?? 0)).toEqual(viewAt(log.frames, 1e9));
    expect(longer.at(5)).toEqual(viewAt(log.frames, 5));
    const other = recursiveTurn().frames;
    const fresh = line.extend(other.slice(2));
    expect(fresh.at(1e9)).toEqual(viewAt(other.slice(2), 1e9));
  });
});

describe("tree: long branches open collapsed", () => {
  it("collapses a run over the limit, and a toggle opens it (and closes a small one)", () => {
    const roots = buildTree(fold(emptyView(), recursiveTurn().frames));
    const run = roots[0]?.children[0];
    if (!run) throw new Error("the fixture has a root run");
    expect([...collapsedSet(roots, new Set())]).toEqual([]);
    expect([...collapsedSet(roots, new Set(), 1)]).toContain(run.id); // over a limit of 1
    expect([...collapsedSet(roots, new Set([run.id]), 1)]).not.toContain(run.id);
    expect([...collapsedSet(roots, new Set([run.id]))]).toEqual([run.id]);
    const rows = visibleRows(roots, collapsedSet(roots, new Set(), 1));
    expect(rows.map((r) => r.node.id)).toEqual([roots[0]?.id, run.id]);
  });
});
