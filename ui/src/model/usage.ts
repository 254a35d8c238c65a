// Tokens, cost and LM latency per turn, from the same view the panels show (so the plot at a
// time-travel step is the plot as it was then). An LLM call belongs to the turn of its run,
// or of the nearest ancestor run that names one.
import type { ViewModel } from "./view";

export interface TurnUsage {
  turn: string;
  index: number;
  label: string;
  calls: number;
  tokens: number;
  cost: number;
  latencyMs: number;
}

export function turnOfRun(view: ViewModel, run: string): string | null {
  const seen = new Set<string>();
  let node = view.runs[run];
  while (node && !seen.has(node.id)) {
    if (node.turn) return node.turn;
    seen.add(node.id);
    node = node.parent ? view.runs[node.parent] : undefined;
  }
  return null;
}

export function usagePerTurn(view: ViewModel): TurnUsage[] {
  const rows = view.turns.map<TurnUsage>((t, i) => ({
    turn: t.id,
    index: i + 1,
    label: t.message.slice(0, 40),
    calls: 0,
    tokens: 0,
    cost: 0,
    latencyMs: 0,
  }));
  const byTurn = new Map(rows.map((r) => [r.turn, r]));
  for (const key of view.llmOrder) {
    const call = view.llmCalls[key];
    if (!call) continue;
    const turn = turnOfRun(view, call.run);
    const row = turn ? byTurn.get(turn) : undefined;
    if (!row) continue;
    row.calls += 1;
    row.tokens += call.promptTokens + call.completionTokens;
    row.cost += call.cost;
    row.latencyMs += call.latencyMs;
  }
  return rows;
}
