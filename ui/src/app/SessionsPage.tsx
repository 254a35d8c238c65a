// The Sessions screen: search, open, restore, export (a JSONL download), import (an upload),
// and the audit badge: the gateway's own verification of the stored log (the UI never
// vouches for a log by re-hashing what it was sent).
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { Link, useNavigate } from "@tanstack/react-router";
import { useId, useRef, useState } from "react";
import type { Api, Audit } from "../api/http";
import { useAuth } from "./auth";
import { ErrorText } from "./ErrorText";
import { button, danger, input, primary, Shell } from "./Shell";

export function AuditBadge({ audit }: { audit: Audit }) {
  if (audit.ok)
    return (
      <p
        data-testid="audit-badge"
        className="rounded border border-emerald-600 bg-emerald-950 px-2 py-1 text-sm text-emerald-200"
      >
        ✓ verified: {audit.checked} events re-hashed
        {audit.signatures ? ", every signature checked against the pinned keys" : " (chain only)"}
      </p>
    );
  const f = audit.fault;
  return (
    <p
      data-testid="audit-badge"
      role="alert"
      className="rounded border border-red-600 bg-red-950 px-2 py-1 text-sm text-red-200"
    >
      ✗ does not verify: first bad event {f?.event_id} (sequence {f?.seq} on {f?.subject}):{" "}
      {f?.reason}
    </p>
  );
}

function download(name: string, text: string) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/x-ndjson" }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export function Detail({ api, id }: { api: Api; id: string }) {
  const client = useQueryClient();
  const navigate = useNavigate();
  const session = useQuery({ queryKey: ["session", id], queryFn: () => api.session(id) });
  const audit = useQuery({ queryKey: ["audit", id], queryFn: () => api.audit(id) });
  const turns = useQuery({ queryKey: ["turns", id], queryFn: () => api.turns(id) });
  const [upto, setUpto] = useState<number | "">("");
  const [title, setTitle] = useState<string | null>(null);
  const renamed = useMutation({
    mutationFn: (next: string) => api.renameSession(id, next),
    onSuccess: async ({ seq }) => {
      setTitle(null);
      // read the rename back at its sequence: a plain refetch can beat the read model to it
      // and show the old title until the next refetch
      client.setQueryData(["session", id], await api.session(id, seq));
      await client.invalidateQueries({ queryKey: ["sessions"] });
    },
  });
  const exported = useMutation({
    mutationFn: () => api.exportSession(id),
    onSuccess: (text) => download(`${id}.jsonl`, text),
  });
  const restored = useMutation({
    mutationFn: () => api.restore(id, upto === "" ? undefined : upto),
    onSuccess: () => client.invalidateQueries({ queryKey: ["session", id] }),
  });
  const s = session.data;
  return (
    <section aria-label="Session detail" className="flex flex-1 flex-col gap-3 overflow-auto p-4">
      <ErrorText error={session.error} />
      {s ? (
        <>
          <h2 className="text-lg font-semibold">{s.title || s.id}</h2>
          <form
            aria-label="Rename"
            className="flex items-center gap-2 text-sm"
            onSubmit={(e) => {
              e.preventDefault();
              if (title?.trim()) renamed.mutate(title.trim());
            }}
          >
            <label htmlFor="session-title">Title</label>
            <input
              id="session-title"
              className={input}
              value={title ?? s.title}
              onChange={(e) => setTitle(e.target.value)}
            />
            <button type="submit" className={button} disabled={title == null || !title.trim()}>
              Rename
            </button>
          </form>
          <ErrorText error={renamed.error} />
          <dl className="grid grid-cols-[10rem_1fr] gap-1 text-sm">
            <dt className="text-slate-300">id</dt>
            <dd className="font-mono">{s.id}</dd>
            <dt className="text-slate-300">turns</dt>
            <dd>{s.turn_count}</dd>
            <dt className="text-slate-300">updated</dt>
            <dd>{new Date(s.updated_at).toLocaleString()}</dd>
            <dt className="text-slate-300">log sequence</dt>
            <dd>{s.last_seq}</dd>
          </dl>
        </>
      ) : null}
      <div aria-live="polite">
        {audit.data ? <AuditBadge audit={audit.data} /> : null}
        {audit.isPending ? <p className="text-sm text-slate-300">verifying the log…</p> : null}
        <ErrorText error={audit.error} />
      </div>
      <div className="flex flex-wrap items-center gap-2">
        <button
          type="button"
          className={primary}
          onClick={() => navigate({ to: "/workspace/$sessionId", params: { sessionId: id } })}
        >
          Open
        </button>
        <button type="button" className={button} onClick={() => exported.mutate()}>
          {exported.isPending ? "Exporting…" : "Export JSONL"}
        </button>
        <button type="button" className={button} onClick={() => audit.refetch()}>
          Verify again
        </button>
      </div>
      <ErrorText error={exported.error} />
      <fieldset className="flex flex-wrap items-center gap-2 rounded border border-slate-700 p-2">
        <legend className="px-1 text-sm text-slate-200">Restore</legend>
        <label className="text-sm text-slate-200">
          State as of{" "}
          <select
            className={input}
            value={upto}
            onChange={(e) => setUpto(e.target.value ? Number(e.target.value) : "")}
          >
            <option value="">the whole log</option>
            {turns.data?.items.map((t) => (
              <option key={t.id} value={t.last_seq}>
                turn {t.turn_index + 1}: {t.user_message.slice(0, 40)} (seq {t.last_seq})
              </option>
            ))}
          </select>
        </label>
        <button type="button" className={danger} onClick={() => restored.mutate()}>
          {restored.isPending ? "Restoring…" : "Restore"}
        </button>
        {restored.data ? (
          <output className="text-sm text-emerald-200" data-testid="restored">
            restored up to sequence {restored.data.upto_seq} (recorded at {restored.data.seq})
            {restored.data.sandbox_error ? ` · sandbox: ${restored.data.sandbox_error}` : ""}{" "}
            <Link
              className="underline"
              to="/workspace/$sessionId"
              params={{ sessionId: id }}
              search={{ at: restored.data.upto_seq }}
            >
              open it at that step
            </Link>
          </output>
        ) : null}
      </fieldset>
      <ErrorText error={restored.error} />
      <ErrorText error={turns.error} />
    </section>
  );
}

function Import({ api, onDone }: { api: Api; onDone: (id: string) => void }) {
  const ref = useRef<HTMLInputElement>(null);
  const id = useId();
  const imported = useMutation({
    mutationFn: async (file: File) => api.importSession(await file.text()),
    onSuccess: (r) => onDone(r.session_id),
  });
  return (
    <div className="flex flex-col gap-1">
      <input
        id={id}
        ref={ref}
        type="file"
        accept=".jsonl,application/x-ndjson"
        className="peer sr-only"
        onChange={(e) => {
          const file = e.target.files?.[0];
          if (file) imported.mutate(file);
          if (ref.current) ref.current.value = "";
        }}
      />
      {/* after the input, so its keyboard focus shows on the visible label (peer) */}
      <label
        htmlFor={id}
        className={`${button} cursor-pointer text-center peer-focus-visible:outline-2 peer-focus-visible:outline-amber-400`}
      >
        Import JSONL…
      </label>
      {imported.isPending ? <p className="text-sm text-slate-300">importing…</p> : null}
      {imported.data ? (
        <p className="text-sm text-emerald-200">
          imported {imported.data.events} events as a new session
        </p>
      ) : null}
      <ErrorText error={imported.error} />
    </div>
  );
}

export function SessionsPage({ selected }: { selected?: string }) {
  const { api } = useAuth();
  const [search, setSearch] = useState("");
  const navigate = useNavigate();
  const client = useQueryClient();
  const list = useQuery({
    queryKey: ["sessions", search],
    queryFn: () => (api ? api.sessions(search) : Promise.reject(new Error("signed out"))),
    enabled: Boolean(api),
  });
  if (!api) return null;
  const pick = (id: string) => navigate({ to: "/sessions", search: { id } });
  return (
    <Shell>
      <nav
        aria-label="All sessions"
        className="flex w-80 flex-col gap-2 border-r border-slate-700 p-3"
      >
        <label htmlFor="sessions-search" className="text-sm text-slate-200">
          Search by title or id
        </label>
        <input
          id="sessions-search"
          className={input}
          value={search}
          onChange={(e) => setSearch(e.target.value)}
        />
        <Import
          api={api}
          onDone={async (id) => {
            await client.invalidateQueries({ queryKey: ["sessions"] });
            await pick(id);
          }}
        />
        <ErrorText error={list.error} />
        <ul className="flex flex-col gap-1 overflow-auto">
          {list.data?.items.map((s) => (
            <li key={s.id}>
              <button
                type="button"
                onClick={() => pick(s.id)}
                aria-current={s.id === selected ? "true" : undefined}
                className={`block w-full rounded px-2 py-1 text-left hover:bg-slate-800 ${s.id === selected ? "bg-slate-800" : ""}`}
              >
                <span className="block truncate">{s.title || s.id}</span>
                <span className="text-xs text-slate-300">
                  {s.turn_count} turns · {new Date(s.updated_at).toLocaleString()}
                </span>
              </button>
            </li>
          ))}
          {list.data && list.data.items.length === 0 ? (
            <li className="text-sm text-slate-300">No session matches.</li>
          ) : null}
        </ul>
      </nav>
      {selected ? (
        <Detail key={selected} api={api} id={selected} />
      ) : (
        <p className="p-6 text-slate-300">Pick a session to verify, export or restore it.</p>
      )}
    </Shell>
  );
}
