import { useState } from "react";

const MODES = [
  ["auto", "auto"],
  ["rlm_only", "RLM only"],
  ["tools_only", "tools only"],
] as const;

export function Composer({
  busy,
  onSend,
  onCancel,
}: {
  busy: boolean;
  onSend: (content: string, mode: string) => void;
  onCancel: () => void;
}) {
  const [content, setContent] = useState("");
  const [mode, setMode] = useState<string>("auto");
  const submit = () => {
    const text = content.trim();
    if (!text) return;
    onSend(text, mode);
    setContent("");
  };
  return (
    <form
      className="flex flex-col gap-2 border-t border-slate-700 p-3"
      onSubmit={(e) => {
        e.preventDefault();
        submit();
      }}
    >
      <label htmlFor="composer" className="sr-only">
        Message
      </label>
      <textarea
        id="composer"
        className="min-h-20 rounded border border-slate-600 bg-slate-900 p-2 text-slate-100"
        placeholder="Ask the agent… (Ctrl+Enter sends)"
        value={content}
        onChange={(e) => setContent(e.target.value)}
        onKeyDown={(e) => {
          if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
            e.preventDefault();
            submit();
          }
        }}
      />
      <div className="flex items-center gap-3">
        <label className="text-sm text-slate-200">
          Execution mode{" "}
          <select
            className="rounded border border-slate-600 bg-slate-900 p-1"
            value={mode}
            onChange={(e) => setMode(e.target.value)}
          >
            {MODES.map(([value, label]) => (
              <option key={value} value={value}>
                {label}
              </option>
            ))}
          </select>
        </label>
        <span className="flex-1" />
        {busy ? (
          <button
            type="button"
            onClick={onCancel}
            className="rounded bg-red-800 px-3 py-1 font-medium text-white hover:bg-red-700"
          >
            Cancel turn
          </button>
        ) : null}
        <button
          type="submit"
          disabled={!content.trim()}
          className="rounded bg-sky-700 px-3 py-1 font-medium text-white hover:bg-sky-600 disabled:bg-slate-700 disabled:text-slate-300"
        >
          Send
        </button>
      </div>
    </form>
  );
}
