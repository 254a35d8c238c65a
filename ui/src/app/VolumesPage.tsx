// Volumes: pick one of the tenant's durable volumes (those its sandboxes mount, or a name typed
// in), browse it, preview a file (text as UTF-8, anything else said to be binary).
import { useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { entries, parentOf } from "../model/volume";
import { useAuth } from "./auth";
import { ErrorText } from "./ErrorText";
import { button, input, Shell } from "./Shell";

export function VolumesPage() {
  const { api } = useAuth();
  const [volume, setVolume] = useState("");
  const [dir, setDir] = useState("");
  const [file, setFile] = useState<string | null>(null);
  const known = useQuery({
    queryKey: ["sandboxes", ""],
    queryFn: () => (api as NonNullable<typeof api>).sandboxes(""),
    enabled: Boolean(api),
  });
  const volumes = [...new Set((known.data?.items ?? []).map((s) => s.volume).filter(Boolean))];
  const chosen = volume || volumes[0] || "";
  const tree = useQuery({
    queryKey: ["volume", chosen, dir],
    queryFn: () => (api as NonNullable<typeof api>).volumeTree(chosen, dir),
    enabled: Boolean(api && chosen),
  });
  const preview = useQuery({
    queryKey: ["volume-file", chosen, file],
    queryFn: () => (api as NonNullable<typeof api>).volumeFile(chosen, file ?? ""),
    enabled: Boolean(api && chosen && file),
  });
  if (!api) return null;
  const rows = entries(tree.data);
  const pick = (name: string) => {
    setVolume(name);
    setDir("");
    setFile(null);
  };
  return (
    <Shell>
      <section
        aria-label="Volume"
        className="flex w-96 flex-col gap-2 overflow-auto border-r border-slate-700 p-3"
      >
        <label className="flex flex-col gap-1 text-sm text-slate-200">
          Volume
          <input
            className={input}
            list="known-volumes"
            value={chosen}
            onChange={(e) => pick(e.target.value.trim())}
            placeholder="a volume name"
          />
          <datalist id="known-volumes">
            {volumes.map((v) => (
              <option key={v} value={v ?? ""} />
            ))}
          </datalist>
        </label>
        {!chosen ? (
          <p className="text-sm text-slate-300">
            No sandbox of yours mounts a volume yet; type a volume's name.
          </p>
        ) : null}
        <div className="flex items-center gap-2">
          <button
            type="button"
            className={button}
            disabled={!dir}
            onClick={() => setDir(parentOf(dir))}
          >
            Up
          </button>
          <span className="truncate font-mono text-sm">
            {chosen}:/{dir}
          </span>
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
                {!e.dir ? <span className="text-slate-300"> · {e.size} B</span> : null}
              </button>
            </li>
          ))}
          {tree.data && rows.length === 0 ? <li className="text-slate-300">empty</li> : null}
          {tree.data?.truncated ? (
            <li className="text-amber-200">the listing was cut at {rows.length} entries</li>
          ) : null}
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
          preview.data.encoding === "utf-8" ? (
            <>
              <pre className="overflow-auto rounded bg-slate-900 p-2 text-sm whitespace-pre-wrap">
                {preview.data.content}
              </pre>
              <p className="text-sm text-slate-300">
                {preview.data.bytes} bytes shown
                {preview.data.truncated ? " (the file is longer)" : ""} · sha256{" "}
                {preview.data.sha256.slice(0, 16)}…
              </p>
            </>
          ) : (
            <p className="text-sm text-slate-200">
              A binary file: {preview.data.bytes} bytes, not shown (sha256{" "}
              {preview.data.sha256.slice(0, 16)}…).
            </p>
          )
        ) : null}
      </section>
    </Shell>
  );
}
