// @vitest-environment jsdom
import { cleanup, fireEvent, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { bigSession } from "../../bench/shared";
import { Log } from "../model/fixtures";
import { fold, foldDelta } from "../model/fold";
import { emptyView } from "../model/view";
import { BudgetBar, ExecutionPanel, SHOWN } from "./ExecutionPanel";
import { AuditBadge } from "./SessionsPage";
import { SHOWN_TURNS, Transcript } from "./Transcript";

afterEach(cleanup);

describe("audit badge", () => {
  it("says verified with what was checked, or names the first bad event", () => {
    const ok = {
      session_id: "s",
      ok: true,
      checked: 12,
      signatures: true,
      require_signatures: true,
      fault: null,
    };
    render(<AuditBadge audit={ok} />);
    expect(screen.getByTestId("audit-badge").textContent).toBe(
      "✓ verified: 12 events re-hashed, every signature checked against the pinned keys",
    );
    cleanup();
    render(<AuditBadge audit={{ ...ok, signatures: false }} />);
    expect(screen.getByTestId("audit-badge").textContent).toMatch(
      /12 events re-hashed \(chain only\)$/,
    );
    cleanup();
    const fault = {
      subject: "fleet.session.t.s.log",
      seq: 7,
      event_id: "e7",
      reason: "hash mismatch",
    };
    render(<AuditBadge audit={{ ...ok, ok: false, checked: 7, fault }} />);
    const bad = screen.getByRole("alert");
    expect(bad.textContent).toBe(
      "✗ does not verify: first bad event e7 (sequence 7 on fleet.session.t.s.log): hash mismatch",
    );
  });
});

describe("execution panel", () => {
  it("counts a call in flight as in flight, not as used", () => {
    const log = new Log();
    log.add({ type: "session.created" });
    log.add({ type: "turn.requested", message: "hi" }, { turn: "t" });
    log.add(
      { type: "run.started", kind: "chat", tree: "x", max_llm_calls: 5 },
      { turn: "t", run: "r" },
    );
    const text = JSON.stringify({ grant: "r-g1", role: "planner", model: "qwen" });
    const view = foldDelta(fold(emptyView(), log.frames), {
      type: "delta",
      kind: "llm_call_started",
      run: "r",
      text,
    });
    render(<BudgetBar view={view} />);
    expect(screen.getByRole("list", { name: "Budget" }).textContent).toMatch(
      /^LLM calls 0 used · 1 in flight · 5 left/,
    );
  });

  it("shows the latest cells and calls, and the earlier ones on request", () => {
    const view = fold(emptyView(), bigSession(1000).frames);
    expect(view.cellOrder.length).toBeGreaterThan(SHOWN);
    const { container } = render(<ExecutionPanel view={view} />);
    const shown = () =>
      [...container.querySelectorAll("[data-cell]")].map((e) => e.getAttribute("data-cell"));
    expect(shown()).toEqual(view.cellOrder.slice(-SHOWN));
    const hidden = view.cellOrder.length - SHOWN;
    fireEvent.click(
      screen.getAllByRole("button", { name: `Show ${hidden} earlier` })[0] as HTMLElement,
    );
    expect(shown()).toEqual(view.cellOrder);
    expect(container.querySelectorAll("tbody tr[data-call]").length).toBe(view.llmOrder.length);
  });
});

describe("transcript", () => {
  it("shows the latest turns, and the earlier ones on request", () => {
    const view = fold(emptyView(), bigSession(4000).frames);
    expect(view.turns.length).toBeGreaterThan(SHOWN_TURNS);
    const { container } = render(<Transcript view={view} />);
    const shown = () =>
      [...container.querySelectorAll("[data-turn]")].map((e) => e.getAttribute("data-turn"));
    expect(shown()).toEqual(view.turns.slice(-SHOWN_TURNS).map((t) => t.id));
    fireEvent.click(
      screen.getByRole("button", { name: `Show ${view.turns.length - SHOWN_TURNS} earlier turns` }),
    );
    expect(shown()).toEqual(view.turns.map((t) => t.id));
  });
});

describe("a model call's prompt and reply", () => {
  it("are one click away under the call's row, from the record", async () => {
    const { Log } = await import("../model/fixtures");
    const log = new Log();
    log.add({ type: "session.created" });
    log.add({ type: "turn.requested", message: "hi" }, { turn: "t1" });
    log.add({ type: "run.started", kind: "chat", tree: "tr" }, { turn: "t1", run: "r1" });
    log.add(
      {
        type: "run.llm_called",
        role: "planner",
        model: "m",
        call_id: "k1",
        messages: [
          { role: "system", content: "You answer questions." },
          { role: "user", content: "What is 17 * 23?" },
        ],
        response: "[[ ## code ## ]]\nprint(17 * 23)",
      },
      { turn: "t1", run: "r1" },
    );
    render(<ExecutionPanel view={fold(emptyView(), log.frames)} />);
    const exchange = screen.getByTestId("call-exchange");
    expect(exchange.textContent).not.toContain("What is 17 * 23?"); // drawn only when asked
    fireEvent.click(screen.getByRole("button", { name: "prompt and reply" }));
    expect(exchange.textContent).toContain("What is 17 * 23?");
    expect(exchange.textContent).toContain("You answer questions.");
    expect(screen.getByTestId("call-reply").textContent).toBe("[[ ## code ## ]]\nprint(17 * 23)");
  });
});
