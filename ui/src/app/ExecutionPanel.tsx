import { memo, useState } from "react";
import type { Cell, LlmCall, ViewModel } from "../model/view";
import { Code } from "./Code";
import { cost, ms } from "./format";

export function BudgetBar({ view }: { view: ViewModel }) {
  const budgets = Object.values(view.budgets);
  if (budgets.length === 0) return null;
  return (
    <ul aria-label="Budget" className="flex flex-col gap-1 p-3 text-sm">
      {budgets.map((b) => {
        const left = Math.max(0, b.maxLlmCalls - b.callsUsed);
        const flying = Object.values(view.runs)
          .filter((r) => r.tree === b.tree)
          .reduce((n, r) => n + r.inFlight.length, 0);
        const pct = b.maxLlmCalls ? Math.min(100, (100 * b.callsUsed) / b.maxLlmCalls) : 0;
        return (
          <li key={b.tree}>
            <div className="flex justify-between text-slate-200">
              <span>
                LLM calls {b.callsUsed} used
                {flying ? ` · ${flying} in flight` : ""} ·{" "}
                {b.maxLlmCalls ? `${left} left` : "no limit known"}
              </span>
              <span>
                {b.tokensUsed} tok · {cost(b.costUsed)}
              </span>
            </div>
            <meter
              className="h-2 w-full"
              aria-label="LLM calls used"
              min={0}
              max={b.maxLlmCalls || 1}
              value={b.callsUsed}
              title={`${pct.toFixed(0)}% of the tree's LLM calls used`}
            />
          </li>
        );
      })}
    </ul>
  );
}

/** The latest cells and calls are shown; a long session's earlier ones on request, so a
 * 10,000-event log renders in one frame's budget (bench/ui.py). */
export const SHOWN = 40;

const CellItem = memo(function CellItem({ cell, depth }: { cell: Cell; depth: number }) {
  return (
    <li
      className="rounded border border-slate-700 bg-slate-900 [contain-intrinsic-size:auto_10rem] [content-visibility:auto]"
      data-cell={cell.key}
    >
      <div className="border-b border-slate-700 px-2 py-1 text-xs text-slate-300">
        {depth ? `child run depth ${depth}` : "root run"}
        {cell.iteration != null ? ` · iteration ${cell.iteration}` : ""}
        {cell.durationMs ? ` · ${ms(cell.durationMs)}` : ""}
      </div>
      <Code code={cell.code} />
      {cell.stdout ? (
        <pre className="max-h-48 overflow-auto border-t border-slate-700 p-2 text-sm text-slate-100">
          {cell.stdout}
        </pre>
      ) : null}
      {cell.error ? (
        <pre className="overflow-x-auto border-t border-red-800 p-2 text-sm text-red-300">
          {cell.error}
        </pre>
      ) : null}
      {cell.final != null ? (
        <div className="border-t border-slate-700 p-2 text-sm text-amber-200">
          SUBMIT → {JSON.stringify(cell.final)}
        </div>
      ) : null}
    </li>
  );
});

const CallRow = memo(function CallRow({ c }: { c: LlmCall }) {
  // the prompt is drawn only once asked for: a long session holds thousands of calls
  const [open, setOpen] = useState(false);
  return (
    <>
      <tr className={c.error ? "text-red-300" : ""} data-call={c.key}>
        <td>{c.role}</td>
        <td>{c.model}</td>
        <td>
          {c.promptTokens}/{c.completionTokens}
        </td>
        <td>{cost(c.cost)}</td>
        <td>
          {ms(c.latencyMs)}
          {c.cached ? " (cached)" : ""}
        </td>
      </tr>
      <tr>
        <td colSpan={5}>
          {/* a row of its own: a long error in a cell squeezed the columns together */}
          {c.error ? <p className="break-words text-red-300">{c.error}</p> : null}
          <div data-testid="call-exchange">
            <button
              type="button"
              className="text-slate-300 underline"
              aria-expanded={open}
              onClick={() => setOpen((o) => !o)}
            >
              prompt and reply
            </button>
            {!open ? null : c.prompt === null ? (
              <p className="text-slate-300">
                the prompt is over the inline limit: the trace export holds it whole
              </p>
            ) : (
              c.prompt.map((m, i) => (
                // biome-ignore lint/suspicious/noArrayIndexKey: a prompt's messages never reorder
                <div key={i} className="mt-1">
                  <span className="text-xs uppercase text-slate-300">{m.role}</span>
                  <pre className="max-h-64 overflow-auto whitespace-pre-wrap rounded bg-slate-950 p-2">
                    {m.content}
                  </pre>
                </div>
              ))
            )}
            {open ? (
              <>
                <span className="text-xs uppercase text-slate-300">reply</span>
                <pre
                  className="max-h-64 overflow-auto whitespace-pre-wrap rounded bg-slate-950 p-2"
                  data-testid="call-reply"
                >
                  {c.reply === null ? "(over the inline limit: see the trace export)" : c.reply}
                </pre>
              </>
            ) : null}
          </div>
        </td>
      </tr>
    </>
  );
});

function Earlier({ hidden, onShow }: { hidden: number; onShow: () => void }) {
  if (hidden <= 0) return null;
  return (
    <button type="button" className="self-start text-sm underline" onClick={onShow}>
      Show {hidden} earlier
    </button>
  );
}

export function ExecutionPanel({ view }: { view: ViewModel }) {
  const [all, setAll] = useState(false);
  const live = view.runOrder.map((id) => view.runs[id]).filter((r) => r?.liveStdout);
  const cells = all ? view.cellOrder : view.cellOrder.slice(-SHOWN);
  const calls = all ? view.llmOrder : view.llmOrder.slice(-SHOWN);
  return (
    <div className="flex flex-col gap-3 p-3">
      <section aria-label="Code cells" className="flex flex-col">
        <h3 className="mb-2 font-semibold">Cells ({view.cellOrder.length})</h3>
        <Earlier hidden={view.cellOrder.length - cells.length} onShow={() => setAll(true)} />
        <ol className="flex flex-col gap-2">
          {cells.map((key) => {
            const cell = view.cells[key];
            if (!cell) return null;
            return <CellItem key={key} cell={cell} depth={view.runs[cell.run]?.depth ?? 0} />;
          })}
          {live.map((run) => (
            <li key={`live:${run?.id}`} className="rounded border border-sky-700 bg-slate-900">
              <div className="px-2 py-1 text-xs text-sky-200">running…</div>
              <pre className="p-2 text-sm">{run?.liveStdout}</pre>
            </li>
          ))}
        </ol>
      </section>
      <section
        aria-label="LLM calls"
        className="flex flex-col [contain-intrinsic-size:auto_30rem] [content-visibility:auto]"
      >
        <h3 className="mb-2 font-semibold">LLM calls ({view.llmOrder.length})</h3>
        <Earlier hidden={view.llmOrder.length - calls.length} onShow={() => setAll(true)} />
        <table className="w-full text-left text-sm">
          <thead className="text-slate-300">
            <tr>
              <th className="font-normal">role</th>
              <th className="font-normal">model</th>
              <th className="font-normal">tokens in/out</th>
              <th className="font-normal">cost</th>
              <th className="font-normal">latency</th>
            </tr>
          </thead>
          <tbody>
            {calls.map((key) => {
              const c = view.llmCalls[key];
              return c ? <CallRow key={key} c={c} /> : null;
            })}
          </tbody>
        </table>
      </section>
      {Object.keys(view.tools).length ? (
        <section aria-label="Tool calls">
          <h3 className="mb-2 font-semibold">Tool calls</h3>
          <ul className="text-sm">
            {Object.values(view.tools).map((t) => (
              <li key={t.callId}>
                {t.tool}({JSON.stringify(t.args)}) →{" "}
                {t.done ? (t.error ? `error: ${t.error}` : JSON.stringify(t.result)) : "…"}
              </li>
            ))}
          </ul>
        </section>
      ) : null}
    </div>
  );
}
