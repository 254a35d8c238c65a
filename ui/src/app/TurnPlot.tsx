// Tokens, cost and LM latency per turn as bars (people would rather look than read), with the
// same figures in a table for screen readers and for copying; the session's totals from
// `/stats` underneath.
import { useQuery } from "@tanstack/react-query";
import type { Api } from "../api/http";
import { type TurnUsage, usagePerTurn } from "../model/usage";
import type { ViewModel } from "../model/view";
import { ErrorText } from "./ErrorText";
import { cost, ms } from "./format";

const SERIES = [
  ["tokens", "tokens", "#7dd3fc", (v: number) => String(v)],
  ["cost", "cost", "#fcd34d", cost],
  ["latencyMs", "LM latency", "#6ee7b7", ms],
] as const;

function Bars({
  rows,
  field,
  label,
  colour,
  show,
}: {
  rows: TurnUsage[];
  field: "tokens" | "cost" | "latencyMs";
  label: string;
  colour: string;
  show: (v: number) => string;
}) {
  const width = 480;
  const height = 90;
  const max = Math.max(...rows.map((r) => r[field]), 0) || 1;
  const bar = Math.max(4, Math.min(40, (width - 10) / Math.max(1, rows.length) - 4));
  return (
    <figure className="flex flex-col gap-1">
      <figcaption className="text-sm text-slate-200">
        {label} per turn (max {show(max === 1 && rows.every((r) => !r[field]) ? 0 : max)})
      </figcaption>
      <svg
        role="img"
        aria-label={`${label} per turn: ${rows.map((r) => `turn ${r.index} ${show(r[field])}`).join(", ")}`}
        width={width}
        height={height + 16}
        className="rounded bg-slate-900"
      >
        {rows.map((r, i) => {
          const h = Math.round((r[field] / max) * height);
          const x = 5 + i * (bar + 4);
          return (
            <g key={r.turn}>
              <rect x={x} y={height - h} width={bar} height={h} fill={colour}>
                <title>{`turn ${r.index}: ${show(r[field])}`}</title>
              </rect>
              <text
                x={x + bar / 2}
                y={height + 12}
                fill="#e2e8f0"
                fontSize="10"
                textAnchor="middle"
              >
                {r.index}
              </text>
            </g>
          );
        })}
      </svg>
    </figure>
  );
}

export function TurnPlot({ api, session, view }: { api: Api; session: string; view: ViewModel }) {
  const rows = usagePerTurn(view);
  const stats = useQuery({
    queryKey: ["stats", session, view.turns.length],
    queryFn: () => api.stats(session),
  });
  if (rows.length === 0) return <p className="p-3 text-slate-300">No turns yet.</p>;
  return (
    <div className="flex flex-col gap-3 p-3" data-testid="turn-plot">
      {SERIES.map(([field, label, colour, show]) => (
        <Bars key={field} rows={rows} field={field} label={label} colour={colour} show={show} />
      ))}
      <table className="text-left text-sm">
        <thead className="text-slate-300">
          <tr>
            <th className="font-normal">turn</th>
            <th className="font-normal">LLM calls</th>
            <th className="font-normal">tokens</th>
            <th className="font-normal">cost</th>
            <th className="font-normal">LM latency</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((r) => (
            <tr key={r.turn}>
              <td className="max-w-40 truncate">
                {r.index}. {r.label}
              </td>
              <td>{r.calls}</td>
              <td>{r.tokens}</td>
              <td>{cost(r.cost)}</td>
              <td>{ms(r.latencyMs)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <ErrorText error={stats.error} />
      {stats.data ? (
        <p className="text-sm text-slate-200">
          Session: {stats.data.total_calls} calls · {stats.data.total_tokens_in} tokens in /{" "}
          {stats.data.total_tokens_out} out · {cost(stats.data.total_cost)} · LM{" "}
          {ms(stats.data.total_latency_ms)} · turns {ms(stats.data.turn_latency_ms)}
        </p>
      ) : null}
    </div>
  );
}
