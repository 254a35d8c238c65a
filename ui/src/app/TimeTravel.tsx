// Scrub the session's log: the panels below render `viewAt(frames, seq)`, the same fold the
// live view uses, at the chosen sequence.
import type { EventFrame } from "../model/frames";

export function TimeTravel({
  frames,
  at,
  onChange,
}: {
  frames: EventFrame[];
  at: number | null;
  onChange: (seq: number | null) => void;
}) {
  if (frames.length === 0) return null;
  const index = at == null ? frames.length - 1 : frames.findLastIndex((f) => f.seq <= at);
  const frame = frames[Math.max(0, index)];
  return (
    <div className="flex items-center gap-3 border-b border-slate-700 px-3 py-2 text-sm">
      <label htmlFor="time-travel" className="text-slate-200">
        Time travel
      </label>
      <input
        id="time-travel"
        type="range"
        min={0}
        max={frames.length - 1}
        value={Math.max(0, index)}
        aria-valuetext={`event ${index + 1} of ${frames.length}, sequence ${frame?.seq}`}
        onChange={(e) => {
          const i = Number(e.target.value);
          onChange(i >= frames.length - 1 ? null : (frames[i]?.seq ?? null));
        }}
        className="flex-1"
      />
      <span className="w-72 truncate text-slate-200">
        {at == null ? "live" : `#${index + 1}/${frames.length} seq ${frame?.seq}`} ·{" "}
        {frame?.event.data.type}
      </span>
      {at != null ? (
        <button
          type="button"
          className="rounded bg-slate-700 px-2 py-0.5"
          onClick={() => onChange(null)}
        >
          Back to live
        </button>
      ) : null}
    </div>
  );
}
