import { useId, useRef, useState } from "react";
import type { Uploaded } from "../api/http";
import { ErrorText } from "./ErrorText";

export type Upload = (
  file: File,
  onProgress: (loaded: number, total: number) => void,
) => Promise<Uploaded>;

function Attach({ upload, onDone }: { upload: Upload; onDone: (doc: Uploaded) => void }) {
  const id = useId();
  const ref = useRef<HTMLInputElement>(null);
  const [progress, setProgress] = useState<{ name: string; loaded: number; total: number } | null>(
    null,
  );
  const [done, setDone] = useState<Uploaded | null>(null);
  const [error, setError] = useState<unknown>(null);
  const send = async (file: File) => {
    setDone(null);
    setError(null);
    setProgress({ name: file.name, loaded: 0, total: file.size });
    try {
      const doc = await upload(file, (loaded, total) =>
        setProgress({ name: file.name, loaded, total }),
      );
      setDone(doc);
      onDone(doc);
    } catch (e) {
      setError(e);
    } finally {
      setProgress(null);
    }
  };
  return (
    <div className="flex items-center gap-2 text-sm">
      <input
        id={id}
        ref={ref}
        type="file"
        className="peer sr-only"
        onChange={(e) => {
          const file = e.target.files?.[0];
          if (file) void send(file);
          if (ref.current) ref.current.value = "";
        }}
      />
      <label
        htmlFor={id}
        className="cursor-pointer rounded bg-slate-700 px-2 py-1 text-white hover:bg-slate-600 peer-focus-visible:outline-2 peer-focus-visible:outline-amber-400"
      >
        Attach document
      </label>
      {progress ? (
        <>
          <progress
            aria-label={`uploading ${progress.name}`}
            max={progress.total || 1}
            value={progress.loaded}
          />
          <span>
            {progress.name}{" "}
            {progress.total ? Math.round((100 * progress.loaded) / progress.total) : 0}%
          </span>
        </>
      ) : null}
      {done ? (
        <output data-testid="uploaded" className="text-emerald-200">
          attached “{done.alias}” ({done.chars} characters)
        </output>
      ) : null}
      <ErrorText error={error} />
    </div>
  );
}

const MODES = [
  ["auto", "auto"],
  ["rlm_only", "RLM only"],
  ["tools_only", "tools only"],
] as const;

/** What a message carries besides its text (docs/websocket.md, the `message` frame). */
export interface MessageExtras {
  document_ids?: string[];
  context_paths?: string[];
  repo_url?: string;
  repo_ref?: string;
}

/** The extras as the frame wants them: empty fields left out, paths one per line or comma. */
export function extrasOf(
  documents: readonly string[],
  paths: string,
  repoUrl: string,
  repoRef: string,
): MessageExtras {
  const contextPaths = paths
    .split(/[\n,]/)
    .map((p) => p.trim())
    .filter(Boolean);
  return {
    ...(documents.length ? { document_ids: [...documents] } : {}),
    ...(contextPaths.length ? { context_paths: contextPaths } : {}),
    ...(repoUrl.trim() ? { repo_url: repoUrl.trim() } : {}),
    ...(repoRef.trim() ? { repo_ref: repoRef.trim() } : {}),
  };
}

export function Composer({
  busy,
  onSend,
  onCancel,
  upload,
}: {
  busy: boolean;
  onSend: (content: string, mode: string, extras: MessageExtras) => void;
  onCancel: () => void;
  upload?: Upload;
}) {
  const [content, setContent] = useState("");
  const [mode, setMode] = useState<string>("auto");
  const [documents, setDocuments] = useState<string[]>([]);
  const [paths, setPaths] = useState("");
  const [repoUrl, setRepoUrl] = useState("");
  const [repoRef, setRepoRef] = useState("");
  const submit = () => {
    const text = content.trim();
    if (!text) return;
    onSend(text, mode, extrasOf(documents, paths, repoUrl, repoRef));
    setContent("");
    setDocuments([]);
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
      {documents.length ? (
        <ul aria-label="Documents for the next message" className="flex flex-wrap gap-2 text-sm">
          {documents.map((alias) => (
            <li key={alias} className="flex items-center gap-1 rounded bg-slate-800 px-2 py-0.5">
              📄 {alias}
              <button
                type="button"
                aria-label={`remove ${alias} from the next message`}
                className="px-1 text-slate-200 hover:text-white"
                onClick={() => setDocuments((d) => d.filter((x) => x !== alias))}
              >
                ×
              </button>
            </li>
          ))}
        </ul>
      ) : null}
      <details className="text-sm text-slate-200">
        <summary className="cursor-pointer">Repository and context paths</summary>
        <div className="mt-2 grid grid-cols-[9rem_1fr] items-center gap-2">
          <label htmlFor="repo-url">Repository URL</label>
          <input
            id="repo-url"
            className="rounded border border-slate-600 bg-slate-900 p-1"
            value={repoUrl}
            onChange={(e) => setRepoUrl(e.target.value)}
            placeholder="https://… (the gateway says whether it takes one)"
          />
          <label htmlFor="repo-ref">Ref</label>
          <input
            id="repo-ref"
            className="rounded border border-slate-600 bg-slate-900 p-1"
            value={repoRef}
            onChange={(e) => setRepoRef(e.target.value)}
            placeholder="branch, tag or commit"
          />
          <label htmlFor="context-paths">Context paths</label>
          <textarea
            id="context-paths"
            className="min-h-12 rounded border border-slate-600 bg-slate-900 p-1"
            value={paths}
            onChange={(e) => setPaths(e.target.value)}
            placeholder="files of the session's checkout, one per line"
          />
        </div>
      </details>
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
        {upload ? (
          <Attach
            upload={upload}
            onDone={(doc) => setDocuments((d) => (d.includes(doc.alias) ? d : [...d, doc.alias]))}
          />
        ) : null}
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
