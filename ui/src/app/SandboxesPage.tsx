// Sandboxes: the tenant's list, one inspected, archive and delete.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import type { Sandbox } from "../api/http";
import { useAuth } from "./auth";
import { ErrorText } from "./ErrorText";
import { button, danger, input, Shell } from "./Shell";

function Inspect({ id }: { id: string }) {
  const { api } = useAuth();
  const client = useQueryClient();
  const info = useQuery({
    queryKey: ["sandbox", id],
    queryFn: () => (api as NonNullable<typeof api>).sandbox(id),
  });
  const done = () => client.invalidateQueries({ queryKey: ["sandboxes"] });
  const archive = useMutation({
    mutationFn: () => (api as NonNullable<typeof api>).archiveSandbox(id),
    onSuccess: done,
  });
  const remove = useMutation({
    mutationFn: () => (api as NonNullable<typeof api>).deleteSandbox(id),
    onSuccess: done,
  });
  return (
    <section aria-label="Sandbox detail" className="flex flex-col gap-2 p-4">
      <h2 className="font-mono text-lg">{id}</h2>
      <ErrorText error={info.error} />
      {info.data ? (
        <pre className="max-h-96 overflow-auto rounded bg-slate-900 p-2 text-sm">
          {JSON.stringify(info.data, null, 2)}
        </pre>
      ) : null}
      <div className="flex gap-2">
        <button type="button" className={button} onClick={() => archive.mutate()}>
          Archive
        </button>
        <button
          type="button"
          className={danger}
          onClick={() => {
            if (window.confirm(`Delete sandbox ${id}? Its files are gone for good.`))
              remove.mutate();
          }}
        >
          Delete
        </button>
      </div>
      {archive.data ? <p className="text-sm text-emerald-200">archived</p> : null}
      {remove.data ? <p className="text-sm text-emerald-200">deleted</p> : null}
      <ErrorText error={archive.error} />
      <ErrorText error={remove.error} />
    </section>
  );
}

export function SandboxesPage() {
  const { api } = useAuth();
  const [session, setSession] = useState("");
  const [picked, setPicked] = useState<string | null>(null);
  const list = useQuery({
    queryKey: ["sandboxes", session],
    queryFn: () => (api as NonNullable<typeof api>).sandboxes(session),
    enabled: Boolean(api),
  });
  if (!api) return null;
  return (
    <Shell>
      <section aria-label="Sandboxes" className="flex flex-1 flex-col gap-2 overflow-auto p-4">
        <label className="text-sm text-slate-200">
          Session id (optional){" "}
          <input className={input} value={session} onChange={(e) => setSession(e.target.value)} />
        </label>
        <ErrorText error={list.error} />
        <table className="w-full text-left text-sm">
          <thead className="text-slate-300">
            <tr>
              <th className="font-normal">sandbox</th>
              <th className="font-normal">provider</th>
              <th className="font-normal">status</th>
              <th className="font-normal">session</th>
              <th className="font-normal">volume</th>
            </tr>
          </thead>
          <tbody>
            {list.data?.items.map((s: Sandbox) => (
              <tr key={s.sandbox} className={picked === s.sandbox ? "bg-slate-800" : ""}>
                <td>
                  <button
                    type="button"
                    className="font-mono underline"
                    onClick={() => setPicked(s.sandbox)}
                  >
                    {s.sandbox}
                  </button>
                </td>
                <td>{s.provider}</td>
                <td>
                  {s.status}
                  {s.stopped_reason ? ` (${s.stopped_reason})` : ""}
                </td>
                <td className="font-mono">{s.labels?.session ?? ""}</td>
                <td>
                  {s.volume ?? ""}
                  {s.volume_subpath ? `/${s.volume_subpath}` : ""}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
        {list.data && list.data.items.length === 0 ? (
          <p className="text-sm text-slate-300">No sandboxes.</p>
        ) : null}
      </section>
      {picked ? (
        <aside className="w-[32rem] border-l border-slate-700">
          <Inspect key={picked} id={picked} />
        </aside>
      ) : null}
    </Shell>
  );
}
