// Volumes: browse the tenant's durable volume, preview a file.
import { useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { entries, parentOf } from "../model/volume";
import { useAuth } from "./auth";
import { ErrorText } from "./ErrorText";
import { button, Shell } from "./Shell";

export function VolumesPage() {
  const { api } = useAuth();
  const [dir, setDir] = useState("");
  const [file, setFile] = useState<string | null>(null);
  const tree = useQuery({
    queryKey: ["volume", dir],
    queryFn: () => (api as NonNullable<typeof api>).volumeTree(dir),
    enabled: Boolean(api),
  });
  const preview = useQuery({
    queryKey: ["volume-file", file],
    queryFn: () => (api as NonNullable<typeof api>).volumeFile(file ?? ""),
    enabled: Boolean(api && file),
  });
  if (!api) return null;
  const rows = entries(tree.data, dir);
  return (
    <Shell>
      <section
        aria-label="Volume"
        className="flex w-96 flex-col gap-2 overflow-auto border-r border-slate-700 p-3"
      >
        <div className="flex items-center gap-2">
          <button
            type="button"
            className={button}
            disabled={!dir}
            onClick={() => setDir(parentOf(dir))}
          >
            Up
          </button>
          <span className="truncate font-mono text-sm">/{dir}</span>
        </div>
        <ErrorText error={tree.error} />
        <ul className="flex flex-col text-sm">
          {rows.map((e) => (
            <li key={e.path}>
              <button
                type="button"
                className="w-full rounded px-2 py-0.5 text-left hover:bg-slate-800"
                onClick={() => (e.dir ? setDir(e.path) : setFile(e.path))}
              >
                {e.dir ? "📁 " : "📄 "}
                {e.name}
                {e.size != null && !e.dir ? (
                  <span className="text-slate-300"> · {e.size} B</span>
                ) : null}
              </button>
            </li>
          ))}
          {tree.data && rows.length === 0 ? <li className="text-slate-300">empty</li> : null}
        </ul>
      </section>
      <section aria-label="Preview" className="flex flex-1 flex-col gap-2 overflow-auto p-3">
        {file ? (
          <h2 className="font-mono">{file}</h2>
        ) : (
          <p className="text-slate-300">Pick a file.</p>
        )}
        <ErrorText error={preview.error} />
        {preview.data ? (
          <>
            <pre className="overflow-auto rounded bg-slate-900 p-2 text-sm whitespace-pre-wrap">
              {preview.data.content}
            </pre>
            {preview.data.truncated ? (
              <p className="text-sm text-amber-200">preview truncated</p>
            ) : null}
          </>
        ) : null}
      </section>
    </Shell>
  );
}
