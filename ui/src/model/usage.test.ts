import { describe, expect, it } from "vitest";
import { Log, recursiveTurn } from "./fixtures";
import { fold, viewAt } from "./fold";
import { turnOfRun, usagePerTurn } from "./usage";
import { emptyView } from "./view";
import { entries, parentOf } from "./volume";

describe("usage per turn", () => {
  it("sums a turn's LLM calls, its child runs' included", () => {
    const view = fold(emptyView(), recursiveTurn().frames);
    const [row] = usagePerTurn(view);
    expect(row).toMatchObject({ turn: "t1", index: 1, calls: 2, tokens: 180, latencyMs: 70 });
    expect(row?.cost).toBeCloseTo(0.015);
  });

  it("keeps turns apart and shows the plot as it was at a time-travel step", () => {
    const log = recursiveTurn();
    const firstCall = log.frames.find((f) => f.event.data.type === "run.llm_called");
    log.add({ type: "turn.requested", message: "again" }, { turn: "t2" });
    log.add({ type: "run.started", kind: "rlm", tree: "tree2" }, { turn: "t2", run: "r9" });
    log.add(
      { type: "run.llm_called", role: "main", model: "m", call_id: "c9", prompt_tokens: 7 },
      { turn: "t2", run: "r9" },
    );
    const rows = usagePerTurn(fold(emptyView(), log.frames));
    expect(rows.map((r) => [r.turn, r.calls, r.tokens])).toEqual([
      ["t1", 2, 180],
      ["t2", 1, 7],
    ]);
    const early = usagePerTurn(viewAt(log.frames, firstCall?.seq ?? 0));
    expect(early.map((r) => [r.turn, r.calls, r.tokens])).toEqual([["t1", 1, 120]]);
  });

  it("finds a child run's turn through its parents and survives a parent cycle", () => {
    const view = fold(emptyView(), recursiveTurn().frames);
    const r2 = view.runs.r2;
    if (!r2) throw new Error("the fixture has a child run r2");
    const orphan = { ...view, runs: { ...view.runs, r2: { ...r2, turn: null } } };
    expect(turnOfRun(orphan, "r2")).toBe("t1");
    const a = { ...r2, id: "a", turn: null, parent: "b" };
    const b = { ...r2, id: "b", turn: null, parent: "a" };
    expect(turnOfRun({ ...view, runs: { a, b } }, "a")).toBeNull();
    expect(usagePerTurn(fold(emptyView(), new Log().frames))).toEqual([]);
  });
});

describe("volume listing", () => {
  it("joins paths under the listed directory, directories first", () => {
    const listed = entries({
      volume: "v",
      path: "x/",
      truncated: false,
      entries: [
        { name: "b.txt", kind: "file", size: 3 },
        { name: "src", kind: "dir", size: 0 },
        { name: "a.py", kind: "file", size: 9 },
      ],
    });
    expect(listed).toEqual([
      { name: "src", path: "x/src", dir: true, size: 0 },
      { name: "a.py", path: "x/a.py", dir: false, size: 9 },
      { name: "b.txt", path: "x/b.txt", dir: false, size: 3 },
    ]);
    const root = entries({
      volume: "v",
      path: "",
      truncated: false,
      entries: [{ name: "f", kind: "other", size: 1 }],
    });
    expect(root).toEqual([{ name: "f", path: "f", dir: false, size: 1 }]);
    expect(entries(undefined)).toEqual([]);
    expect(parentOf("a/b/c")).toBe("a/b");
    expect(parentOf("a")).toBe("");
  });
});
