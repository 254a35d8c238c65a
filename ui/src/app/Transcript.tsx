import { memo, useState } from "react";
import type { Turn, ViewModel } from "../model/view";

const STATUS: Record<string, string> = {
  requested: "queued",
  running: "running",
  parked: "waiting for your answer",
  completed: "done",
  failed: "failed",
  cancelled: "cancelled",
  refused: "refused",
};

const TurnItem = memo(function TurnItem({ turn }: { turn: Turn }) {
  return (
    <li
      className="flex flex-col gap-2 [contain-intrinsic-size:auto_6rem] [content-visibility:auto]"
      data-turn={turn.id}
    >
      <div className="self-end max-w-[85%] rounded-lg bg-sky-900 px-3 py-2 whitespace-pre-wrap">
        {turn.message}
      </div>
      <div className="max-w-[85%] rounded-lg bg-slate-800 px-3 py-2">
        <div className="mb-1 text-xs text-slate-300">
          {turn.mode} · <span data-testid="turn-status">{STATUS[turn.status]}</span>
        </div>
        {turn.fallback ? (
          <p
            className="mb-1 rounded border border-amber-400/60 bg-amber-950/60 px-2 py-1 text-sm text-amber-100"
            data-testid="turn-fallback"
          >
            {turn.fallback}
          </p>
        ) : null}
        {turn.waiting && turn.status === "running" ? (
          <p
            className="mb-1 rounded border border-sky-400/60 bg-sky-950/60 px-2 py-1 text-sm text-sky-100"
            data-testid="turn-waiting"
            aria-live="polite"
          >
            {turn.waiting}
          </p>
        ) : null}
        {turn.answer || turn.streaming ? (
          <p className="whitespace-pre-wrap" aria-live="polite">
            {turn.answer || turn.streaming}
          </p>
        ) : (turn.status === "running" || turn.status === "requested") && !turn.waiting ? (
          <p className="text-slate-300">…</p>
        ) : null}
        {turn.error ? (
          <p role="alert" className="mt-1 text-red-300">
            {turn.error}
          </p>
        ) : null}
      </div>
    </li>
  );
});

/** The latest turns are shown, earlier ones on request (a 10,000-event session has ~160). */
export const SHOWN_TURNS = 30;

export function Transcript({ view }: { view: ViewModel }) {
  const [all, setAll] = useState(false);
  if (view.turns.length === 0)
    return <p className="p-4 text-slate-300">No messages yet. Ask something below.</p>;
  const turns = all ? view.turns : view.turns.slice(-SHOWN_TURNS);
  const hidden = view.turns.length - turns.length;
  return (
    <div className="flex flex-col p-4">
      {hidden > 0 ? (
        <button
          type="button"
          className="self-center text-sm underline"
          onClick={() => setAll(true)}
        >
          Show {hidden} earlier turns
        </button>
      ) : null}
      <ol className="flex flex-col gap-4" aria-label="Transcript">
        {turns.map((turn) => (
          <TurnItem key={turn.id} turn={turn} />
        ))}
      </ol>
    </div>
  );
}
