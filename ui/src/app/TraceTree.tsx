// The recursive trace tree twice over: an ARIA tree (the keyboard and screen-reader view) and
// an @xyflow/react graph of the same visible rows. Collapsing a branch hides it from both.
import { Background, type Edge, type Node, ReactFlow } from "@xyflow/react";
import "@xyflow/react/dist/style.css";
import { memo, useMemo, useState } from "react";
import { buildTree, collapsedSet, treeKey, type VisibleRow, visibleRows } from "../model/tree";
import type { ViewModel } from "../model/view";
import { Code } from "./Code";
import { cost, ms } from "./format";

const TONE: Record<string, string> = {
  completed: "#34d399",
  running: "#38bdf8",
  requested: "#38bdf8",
  parked: "#fbbf24",
  failed: "#f87171",
  cancelled: "#fca5a5",
  refused: "#f87171",
};

/** What one tree node holds, opened: a run's task, status, answer or error and its steps; a
 * cell's code and output; an LLM call's model, tokens, cost and latency. */
function NodeDetail({ view, id }: { view: ViewModel; id: string }) {
  const [kind, ...rest] = id.split(":");
  const key = rest.join(":");
  if (kind === "run") {
    const run = view.runs[key];
    if (!run) return null;
    const calls = run.llmCalls.length + run.iterations.reduce((n, i) => n + i.llmCalls.length, 0);
    const cells = run.cells.length + run.iterations.reduce((n, i) => n + i.cells.length, 0);
    return (
      <section
        aria-label="Run detail"
        data-testid="run-detail"
        className="rounded border border-slate-700 p-2 text-sm"
      >
        <h4 className="font-semibold">
          {run.kind} run{run.depth ? ` at depth ${run.depth}` : ""} · {run.status}
        </h4>
        <p className="font-mono text-xs text-slate-300">{run.id}</p>
        {run.task ? <p>task: {run.task}</p> : null}
        <p>
          {run.iterations.length} iterations · {cells} cells · {calls} LLM calls ·{" "}
          {run.children.length} child runs
        </p>
        {run.answer ? <p className="text-emerald-200">answer: {run.answer}</p> : null}
        {run.error ? <p className="text-red-300">error: {run.error}</p> : null}
      </section>
    );
  }
  if (kind === "cell") {
    const cell = view.cells[key];
    if (!cell) return null;
    return (
      <section aria-label="Cell detail" className="rounded border border-slate-700 text-sm">
        <Code code={cell.code} />
        {cell.stdout ? <pre className="border-t border-slate-700 p-2">{cell.stdout}</pre> : null}
        {cell.error ? (
          <pre className="border-t border-red-800 p-2 text-red-300">{cell.error}</pre>
        ) : null}
      </section>
    );
  }
  if (kind === "flight") {
    const c = Object.values(view.runs)
      .flatMap((r) => r.inFlight)
      .find((f) => f.grant === key);
    if (!c) return null;
    return (
      <section aria-label="LLM call detail" className="rounded border border-slate-700 p-2 text-sm">
        {c.role} · {c.model} · in flight: sent under grant {c.grant}, no reply yet
      </section>
    );
  }
  if (kind === "llm") {
    const c = view.llmCalls[key];
    if (!c) return null;
    return (
      <section aria-label="LLM call detail" className="rounded border border-slate-700 p-2 text-sm">
        {c.role} · {c.model} · {c.promptTokens} in / {c.completionTokens} out · {cost(c.cost)} ·{" "}
        {ms(c.latencyMs)}
        {c.error ? <p className="text-red-300">{c.error}</p> : null}
      </section>
    );
  }
  return null;
}

/** Beyond this many open rows the graph is not drawn (xyflow lays out every node each frame; a
 * 2,000-event turn opens ~2,000 rows): the ARIA tree above still shows them all. */
export const GRAPH_MAX = 150;

const TreeRow = memo(
  function TreeRow({
    row,
    selected,
    onPick,
  }: {
    row: VisibleRow;
    selected: boolean;
    onPick: (row: VisibleRow) => void;
  }) {
    return (
      <div
        id={`tree-${row.node.id}`}
        role="treeitem"
        tabIndex={-1}
        aria-level={row.depth + 1}
        aria-expanded={row.node.children.length ? row.expanded : undefined}
        aria-selected={selected}
        className={`flex cursor-pointer gap-2 px-2 py-0.5 [contain-intrinsic-size:auto_1.5rem] [content-visibility:auto] ${selected ? "bg-slate-700" : ""}`}
        style={{ paddingLeft: `${row.depth * 16 + 8}px` }}
        onClick={() => onPick(row)}
        onKeyDown={() => {}}
      >
        <span aria-hidden="true" className="w-3">
          {row.node.children.length ? (row.expanded ? "▾" : "▸") : ""}
        </span>
        <span className="text-slate-300">{row.node.kind}</span>
        <span>{row.node.label}</span>
        <span style={{ color: TONE[row.node.status] }}>{row.node.status}</span>
      </div>
    );
  },
  // a row is redrawn only when what it shows changed (the tree is rebuilt on every fold)
  (a, b) =>
    a.selected === b.selected &&
    a.row.depth === b.row.depth &&
    a.row.expanded === b.row.expanded &&
    a.row.node.label === b.row.node.label &&
    a.row.node.status === b.row.node.status &&
    a.row.node.children.length === b.row.node.children.length,
);

export function TraceTree({ view }: { view: ViewModel }) {
  const roots = useMemo(() => buildTree(view), [view]);
  const [toggled, setToggled] = useState<Set<string>>(new Set());
  const collapsed = useMemo(() => collapsedSet(roots, toggled), [roots, toggled]);
  const [focused, setFocused] = useState<string | null>(null);
  const rows = useMemo(() => visibleRows(roots, collapsed), [roots, collapsed]);
  const toggle = (id: string) =>
    setToggled((t) => {
      const next = new Set(t);
      if (next.has(id)) next.delete(id);
      else next.add(id);
      return next;
    });
  const { nodes, edges } = useMemo(() => {
    if (rows.length > GRAPH_MAX) return { nodes: [], edges: [] };
    const nodes: Node[] = rows.map((row, i) => ({
      id: row.node.id,
      position: { x: row.depth * 60, y: i * 44 },
      data: { label: row.node.label },
      style: {
        borderColor: TONE[row.node.status] ?? "#94a3b8",
        background: "#0f172a",
        color: "#f1f5f9",
        width: 260,
        fontSize: 12,
        outline: row.node.id === focused ? "2px solid #fbbf24" : undefined,
      },
      sourcePosition: "bottom" as Node["sourcePosition"],
      targetPosition: "left" as Node["targetPosition"],
    }));
    const edges: Edge[] = rows
      .filter((r) => r.parent)
      .map((r) => ({
        id: `${r.parent}->${r.node.id}`,
        source: r.parent ?? "",
        target: r.node.id,
        type: "smoothstep",
      }));
    return { nodes, edges };
  }, [rows, focused]);

  if (rows.length === 0) return <p className="p-3 text-slate-300">No runs yet.</p>;
  const current = focused ?? rows[0]?.node.id ?? null;
  const pick = (row: VisibleRow) => {
    setFocused(row.node.id);
    if (row.node.children.length) toggle(row.node.id);
  };
  return (
    <div className="flex h-full flex-col gap-2 p-3">
      <div
        role="tree"
        aria-label="Trace tree"
        tabIndex={0}
        aria-activedescendant={current ? `tree-${current}` : undefined}
        className="max-h-72 overflow-auto rounded border border-slate-700 text-sm"
        onKeyDown={(e) => {
          const move = treeKey(rows, current, e.key);
          if (move.focus === current && !move.toggle && !e.key.startsWith("Arrow")) return;
          e.preventDefault();
          if (move.toggle) toggle(move.toggle);
          setFocused(move.focus);
        }}
      >
        {rows.map((row) => (
          <TreeRow key={row.node.id} row={row} selected={row.node.id === current} onPick={pick} />
        ))}
      </div>
      {current ? <NodeDetail view={view} id={current} /> : null}
      {rows.length <= GRAPH_MAX ? (
        <div className="h-96 rounded border border-slate-700" aria-hidden="true">
          <ReactFlow nodes={nodes} edges={edges} fitView nodesDraggable={false} colorMode="dark">
            <Background />
          </ReactFlow>
        </div>
      ) : (
        <p className="text-sm text-slate-300">
          The graph draws up to {GRAPH_MAX} rows and {rows.length} are open: collapse branches (← on
          a row) to see it.
        </p>
      )}
    </div>
  );
}
