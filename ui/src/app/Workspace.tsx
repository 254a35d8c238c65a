import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { Link, useNavigate } from "@tanstack/react-router";
import { useEffect, useMemo, useState } from "react";
import type { Api } from "../api/http";
import type { SocketState } from "../api/socket";
import { useAuth } from "./auth";
import { Clarification } from "./Clarification";
import { Composer } from "./Composer";
import { ErrorText } from "./ErrorText";
import { BudgetBar, ExecutionPanel } from "./ExecutionPanel";
import { newId } from "./format";
import { Shell } from "./Shell";
import { TimeTravel } from "./TimeTravel";
import { TraceTree } from "./TraceTree";
import { Transcript } from "./Transcript";
import { TurnPlot } from "./TurnPlot";
import { useSession } from "./useSession";
import { useTimeline } from "./useTimeline";

function Sessions({ api, current }: { api: Api; current: string | null }) {
  const [search, setSearch] = useState("");
  const client = useQueryClient();
  const navigate = useNavigate();
  const list = useQuery({
    queryKey: ["sessions", search],
    queryFn: () => api.sessions(search),
    refetchInterval: 5000,
  });
  const create = useMutation({
    mutationFn: () => api.createSession(""),
    onSuccess: async (made) => {
      await client.invalidateQueries({ queryKey: ["sessions"] });
      await navigate({ to: "/workspace/$sessionId", params: { sessionId: made.session.id } });
    },
  });
  return (
    <nav aria-label="Sessions" className="flex w-64 flex-col gap-2 border-r border-slate-700 p-3">
      <button
        type="button"
        className="rounded bg-sky-700 px-3 py-1 font-medium text-white hover:bg-sky-600"
        onClick={() => create.mutate()}
      >
        New session
      </button>
      <ErrorText error={create.error} />
      <label htmlFor="session-search" className="sr-only">
        Search sessions
      </label>
      <input
        id="session-search"
        className="rounded border border-slate-600 bg-slate-900 p-1"
        placeholder="Search"
        value={search}
        onChange={(e) => setSearch(e.target.value)}
      />
      <ErrorText error={list.error} />
      <ul className="flex flex-col gap-1 overflow-auto">
        {list.data?.items.map((s) => (
          <li key={s.id}>
            <Link
              to="/workspace/$sessionId"
              params={{ sessionId: s.id }}
              className={`block rounded px-2 py-1 hover:bg-slate-800 ${s.id === current ? "bg-slate-800" : ""}`}
            >
              <span className="block truncate">{s.title || s.id}</span>
              <span className="text-xs text-slate-300">
                {s.turn_count} turns{s.active_turn ? " · running" : ""}
              </span>
            </Link>
          </li>
        ))}
      </ul>
    </nav>
  );
}

function Connection({ state }: { state: SocketState }) {
  const text =
    state.kind === "open"
      ? state.resumedFrom != null
        ? `connected · resumed after sequence ${state.resumedFrom}`
        : "connected"
      : state.kind === "reconnecting"
        ? `reconnecting (try ${state.attempt}) from sequence ${state.lastSeq}${state.reason ? ` · ${state.reason}` : ""}`
        : state.kind === "closed"
          ? `disconnected: ${state.reason}`
          : "connecting…";
  const tone =
    state.kind === "open"
      ? "text-emerald-300"
      : state.kind === "closed"
        ? "text-red-300"
        : "text-amber-300";
  return (
    <output aria-live="polite" className={`text-sm ${tone}`} data-testid="connection">
      {text}
    </output>
  );
}

const TABS = [
  ["execution", "Execution"],
  ["tree", "Trace tree"],
  ["usage", "Usage"],
] as const;

function SessionView({
  api,
  session,
  initialAt,
}: {
  api: Api;
  session: string;
  initialAt: number | null;
}) {
  const feed = useSession(api, session);
  const [at, setAt] = useState<number | null>(initialAt);
  const [tab, setTab] = useState<(typeof TABS)[number][0]>("execution");
  const timeline = useTimeline(feed.frames);
  const view = useMemo(() => (at == null ? feed.view : timeline.at(at)), [at, feed.view, timeline]);
  const active = feed.view.turns.findLast(
    (t) => t.status === "running" || t.status === "requested" || t.status === "parked",
  );
  // the sessions list shows turn counts and "running": refresh it when a turn starts or ends
  const client = useQueryClient();
  const ended = feed.view.turns.filter((t) => t !== active).length;
  const activeId = active?.id ?? null;
  useEffect(() => {
    if (ended || activeId) void client.invalidateQueries({ queryKey: ["sessions"] });
  }, [client, ended, activeId]);
  return (
    <div className="flex min-w-0 flex-1">
      <section aria-label="Conversation" className="flex min-w-0 flex-1 flex-col">
        <header className="flex items-center gap-3 border-b border-slate-700 px-3 py-2">
          <h2 className="flex-1 truncate font-semibold">{feed.view.session.title || session}</h2>
          <Connection state={feed.state} />
        </header>
        <TimeTravel frames={feed.frames} at={at} onChange={setAt} />
        {feed.errors.map((e) => (
          <div key={e.id} className="mx-3 mt-2 flex gap-2">
            <ErrorText error={new Error(`${e.code}: ${e.message}`)} />
            <button type="button" className="text-sm underline" onClick={() => feed.dismiss(e.id)}>
              Dismiss
            </button>
          </div>
        ))}
        <div className="flex-1 overflow-auto">
          <Transcript view={view} />
        </div>
        {at == null && view.pendingInput ? (
          <Clarification
            pending={view.pendingInput}
            onAnswer={(answer, option) =>
              feed.send({
                type: "command",
                command: "answer",
                session_id: session,
                args: {
                  request_id: view.pendingInput?.requestId,
                  answer,
                  ...(option ? { option } : {}),
                },
              })
            }
          />
        ) : null}
        <Composer
          busy={Boolean(active)}
          onSend={(content, mode, extras) =>
            feed.send({
              type: "message",
              content,
              session_id: session,
              id: newId(),
              execution_mode: mode,
              trace_mode: "verbose",
              ...extras,
            })
          }
          upload={(file, onProgress) => api.uploadDocument(session, file, onProgress)}
          onCancel={() =>
            feed.send({
              type: "cancel",
              session_id: session,
              ...(active ? { turn_id: active.id } : {}),
            })
          }
        />
      </section>
      <aside aria-label="Execution" className="flex w-[36rem] flex-col border-l border-slate-700">
        <BudgetBar view={view} />
        <div role="tablist" className="flex gap-1 border-b border-slate-700 px-3">
          {TABS.map(([t, label]) => (
            <button
              type="button"
              role="tab"
              key={t}
              aria-selected={tab === t}
              className={`px-3 py-1 ${tab === t ? "border-b-2 border-sky-400" : "text-slate-300"}`}
              onClick={() => setTab(t)}
            >
              {label}
            </button>
          ))}
        </div>
        <div role="tabpanel" className="flex-1 overflow-auto">
          {tab === "execution" ? (
            <ExecutionPanel view={view} />
          ) : tab === "tree" ? (
            <TraceTree view={view} />
          ) : (
            <TurnPlot api={api} session={session} view={view} />
          )}
        </div>
      </aside>
    </div>
  );
}

export function Workspace({ session, at }: { session: string | null; at?: number }) {
  const { api } = useAuth();
  if (!api) return null;
  return (
    <Shell>
      <Sessions api={api} current={session} />
      {session ? (
        <SessionView key={session} api={api} session={session} initialAt={at ?? null} />
      ) : (
        <p className="p-6 text-slate-300">Open a session, or start a new one.</p>
      )}
    </Shell>
  );
}
