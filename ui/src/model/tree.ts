// The recursive trace tree: turn → runs → iterations → cells / LLM calls → child runs. Built
// from the view model alone, so the live tree and the time-travel tree are the same code.
// Siblings stand in the order they happened (their first event's sequence): a fallback after
// a failed child run is listed below it, whatever their kinds. Calls in flight come last.
import type { ViewModel } from "./view";

export type TreeKind = "turn" | "run" | "iteration" | "cell" | "llm";

export interface TreeNode {
  id: string;
  kind: TreeKind;
  label: string;
  status: string;
  children: TreeNode[];
}

/** In the order they happened: `at` is each node's first sequence (stable for equal ones). */
function byTime(nodes: { node: TreeNode; at: number }[]): TreeNode[] {
  return nodes
    .map((n, i) => ({ ...n, i }))
    .sort((a, b) => a.at - b.at || a.i - b.i)
    .map((n) => n.node);
}

function runNode(view: ViewModel, runId: string, seen: Set<string>): TreeNode | null {
  const run = view.runs[runId];
  // A run reached twice would be a cycle in a corrupted log: show it once, never recurse.
  if (!run || seen.has(runId)) return null;
  seen.add(runId);
  const cell = (key: string): TreeNode => {
    const c = view.cells[key];
    return {
      id: `cell:${key}`,
      kind: "cell",
      label: c ? (c.code.split("\n")[0] ?? "").slice(0, 60) || "(empty cell)" : key,
      status: c?.error ? "failed" : "completed",
      children: [],
    };
  };
  const llm = (key: string): TreeNode => {
    const c = view.llmCalls[key];
    return {
      id: `llm:${key}`,
      kind: "llm",
      label: c ? `${c.role} · ${c.model} · ${c.promptTokens + c.completionTokens} tok` : key,
      status: c?.error ? "failed" : "completed",
      children: [],
    };
  };
  const cellAt = (key: string) => ({ node: cell(key), at: view.cells[key]?.seq ?? 0 });
  const llmAt = (key: string) => ({ node: llm(key), at: view.llmCalls[key]?.seq ?? 0 });
  const kids = run.children.flatMap((child) => {
    const node = runNode(view, child, seen);
    return node ? [{ node, at: view.runs[child]?.seq ?? 0 }] : [];
  });
  const iterations = run.iterations.map((it) => {
    const steps = [...it.llmCalls.map(llmAt), ...it.cells.map(cellAt)];
    return {
      node: {
        id: `iter:${run.id}:${it.index}`,
        kind: "iteration" as const,
        label: `iteration ${it.index}${it.tool ? ` · ${it.tool}` : ""}`,
        status: "completed",
        children: byTime(steps),
      },
      at: Math.min(it.seq, ...steps.map((s) => s.at)),
    };
  });
  const flying = run.inFlight.map((c) => ({
    node: {
      id: `flight:${c.grant}`,
      kind: "llm" as const,
      label: `${c.role} · ${c.model} · in flight`,
      status: "running",
      children: [],
    },
    at: Number.POSITIVE_INFINITY,
  }));
  return {
    id: `run:${run.id}`,
    kind: "run",
    label: `${run.kind}${run.depth ? ` (depth ${run.depth})` : ""}${run.task ? ` · ${run.task.slice(0, 50)}` : ""}`,
    status: run.status,
    children: byTime([
      ...run.llmCalls.map(llmAt),
      ...iterations,
      ...run.cells.map(cellAt),
      ...kids,
      ...flying,
    ]),
  };
}

export function buildTree(view: ViewModel): TreeNode[] {
  const seen = new Set<string>();
  const roots: TreeNode[] = view.turns.map((turn) => {
    const runs = view.runOrder.filter((id) => {
      const run = view.runs[id];
      return run?.turn === turn.id && (!run.parent || !view.runs[run.parent]);
    });
    return {
      id: `turn:${turn.id}`,
      kind: "turn" as const,
      label: turn.message.slice(0, 60) || turn.id,
      status: turn.status,
      children: runs.map((id) => runNode(view, id, seen)).filter((n): n is TreeNode => n !== null),
    };
  });
  // Runs whose turn the log never named still appear, so nothing recorded is hidden.
  const orphans = view.runOrder
    .filter((id) => !seen.has(id) && !view.runs[view.runs[id]?.parent ?? ""])
    .map((id) => runNode(view, id, seen))
    .filter((n): n is TreeNode => n !== null);
  return [...roots, ...orphans];
}

export interface VisibleRow {
  node: TreeNode;
  depth: number;
  parent: string | null;
  expanded: boolean;
}

/** The rows a reader sees with `collapsed` folded away: the order the keyboard walks. */
export function visibleRows(roots: TreeNode[], collapsed: ReadonlySet<string>): VisibleRow[] {
  const rows: VisibleRow[] = [];
  const walk = (node: TreeNode, depth: number, parent: string | null) => {
    const expanded = !collapsed.has(node.id);
    rows.push({ node, depth, parent, expanded });
    if (expanded) for (const child of node.children) walk(child, depth + 1, node.id);
  };
  for (const root of roots) walk(root, 0, null);
  return rows;
}

/** Tree keyboard semantics (WAI-ARIA tree view): where focus goes, or what to toggle. */
export function treeKey(
  rows: VisibleRow[],
  focused: string | null,
  key: string,
): { focus: string | null; toggle?: string } {
  const at = Math.max(
    0,
    rows.findIndex((r) => r.node.id === focused),
  );
  const row = rows[at];
  if (!row) return { focus: null };
  switch (key) {
    case "ArrowDown":
      return { focus: rows[Math.min(rows.length - 1, at + 1)]?.node.id ?? row.node.id };
    case "ArrowUp":
      return { focus: rows[Math.max(0, at - 1)]?.node.id ?? row.node.id };
    case "Home":
      return { focus: rows[0]?.node.id ?? null };
    case "End":
      return { focus: rows.at(-1)?.node.id ?? null };
    case "ArrowRight":
      if (row.node.children.length === 0) return { focus: row.node.id };
      if (!row.expanded) return { focus: row.node.id, toggle: row.node.id };
      return { focus: row.node.children[0]?.id ?? row.node.id };
    case "ArrowLeft":
      if (row.node.children.length > 0 && row.expanded)
        return { focus: row.node.id, toggle: row.node.id };
      return { focus: row.parent ?? row.node.id };
    case "Enter":
    case " ":
      return row.node.children.length > 0
        ? { focus: row.node.id, toggle: row.node.id }
        : { focus: row.node.id };
    default:
      return { focus: row.node.id };
  }
}

/** A branch with more children than this opens collapsed (a long run's hundreds of iterations
 * would otherwise fill the tree); a reader's toggle flips it like any other. */
export const OPEN_LIMIT = 25;

/** The branches shown collapsed: those over `limit` children, flipped by the reader's toggles. */
export function collapsedSet(
  roots: TreeNode[],
  toggled: ReadonlySet<string>,
  limit = OPEN_LIMIT,
): Set<string> {
  const out = new Set<string>();
  const walk = (node: TreeNode) => {
    const big = node.kind !== "turn" && node.children.length > limit;
    if (big !== toggled.has(node.id)) out.add(node.id);
    for (const child of node.children) walk(child);
  };
  for (const root of roots) walk(root);
  return out;
}
