// Speed goals of issue 15 for the fold (printed, never asserted): time travel to any step of a
// 10,000-event session within 200 ms, and a 2,000-event turn folded live one frame at a time
// (the socket's worst case: no batching) well inside one 50 ms frame budget per event.
// Run: (cd ui && npx vitest bench --run)
import { bench, describe } from "vitest";
import { fold, viewAt } from "../src/model/fold";
import { emptyView } from "../src/model/view";
import { bigSession } from "./shared";

const session = bigSession(10_000).frames;
const turn = bigSession(2_000).frames;

describe("time travel over 10,000 events (goal: ≤ 200 ms)", () => {
  bench("viewAt(last step)", () => {
    viewAt(session, session.length);
  });
  bench("viewAt(middle step)", () => {
    viewAt(session, session.length / 2);
  });
});

describe("live: 2,000 events folded one frame at a time", () => {
  bench("2,000 single-frame folds", () => {
    let view = emptyView();
    for (const frame of turn) view = fold(view, [frame]);
  });
});
