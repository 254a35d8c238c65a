// Settings: the runtime's status, LLM profiles (create, edit, delete, test), which profile
// each role uses, the LM and Daytona connectivity tests, and the runtime settings with the
// gateway's validation messages. Keys are write-only: a profile shows `has_api_key`, never a key.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { type Api, ApiError, type ProbeResult, type Profile, ROLES } from "../api/http";
import { useAuth } from "./auth";
import { ErrorText } from "./ErrorText";
import { ms } from "./format";
import { button, danger, input, primary, Shell } from "./Shell";

function Probe({ result }: { result: ProbeResult }) {
  return (
    <div
      data-testid={`probe-${result.kind}`}
      className={`rounded border p-2 text-sm ${result.ok ? "border-emerald-600 text-emerald-200" : "border-red-600 text-red-200"}`}
    >
      <p>
        {result.kind}: {result.ok ? "ok" : "failed"}
        {result.model ? ` · ${result.model}` : ""}
        {result.latency_ms != null ? ` · ${ms(result.latency_ms)}` : ""}
        {result.output_preview ? ` · answered “${result.output_preview}”` : ""}
      </p>
      {result.error ? <p>{result.error}</p> : null}
      <ul className="list-disc pl-5">
        {result.checks.map((c) => (
          <li key={c.name}>
            {c.ok ? "✓" : "✗"} {c.name}
            {c.detail ? `: ${c.detail}` : ""}
          </li>
        ))}
        {result.guidance.map((g) => (
          <li key={g}>{g}</li>
        ))}
      </ul>
    </div>
  );
}

function Status({ api }: { api: Api }) {
  const status = useQuery({ queryKey: ["runtime-status"], queryFn: () => api.runtimeStatus() });
  const s = status.data;
  return (
    <section aria-labelledby="status-h" className="flex flex-col gap-2">
      <h2 id="status-h" className="text-lg font-semibold">
        Status
      </h2>
      <ErrorText error={status.error} />
      {s ? (
        <>
          <p className={s.ready && s.llm_ready ? "text-emerald-200" : "text-amber-200"}>
            mesh {s.ready ? "ready" : "not ready"} · LLM {s.llm_ready ? "ready" : "not ready"}
            {s.agent_replica ? ` · agent ${s.agent_replica}` : ""}
          </p>
          <ul className="text-sm">
            {s.roles.map((r) => (
              <li key={r.role}>
                {r.role}: {r.profile ?? "no profile"} {r.model ? `(${r.model})` : ""}
                {r.problem ? <span className="text-red-300"> · {r.problem}</span> : null}
              </li>
            ))}
            {s.components.map((c) => (
              <li key={c.name}>
                {c.kind} {c.name}: {c.state}
                {c.detail ? ` · ${c.detail}` : ""}
              </li>
            ))}
            {s.guidance.map((g) => (
              <li key={g} className="text-amber-200">
                {g}
              </li>
            ))}
          </ul>
        </>
      ) : null}
    </section>
  );
}

function ProfileRow({ api, profile }: { api: Api; profile: Profile }) {
  const client = useQueryClient();
  const [model, setModel] = useState(profile.model);
  const [base, setBase] = useState(profile.api_base ?? "");
  const refresh = () => client.invalidateQueries({ queryKey: ["profiles"] });
  const save = useMutation({
    mutationFn: () =>
      api.patchProfile(profile.name, { model, api_base: base.trim() ? base.trim() : null }),
    onSuccess: refresh,
  });
  const remove = useMutation({
    mutationFn: () => api.deleteProfile(profile.name),
    onSuccess: refresh,
  });
  const test = useMutation({ mutationFn: () => api.testLm({ profile: profile.name }) });
  return (
    <li
      className="flex flex-col gap-1 rounded border border-slate-700 p-2"
      data-profile={profile.name}
    >
      <div className="flex flex-wrap items-center gap-2 text-sm">
        <strong className="font-mono">{profile.name}</strong>
        <label>
          model <input className={input} value={model} onChange={(e) => setModel(e.target.value)} />
        </label>
        <label>
          API base{" "}
          <input className={input} value={base} onChange={(e) => setBase(e.target.value)} />
        </label>
        <span className="text-slate-300">
          {profile.has_api_key ? "key stored" : "no key"} · rev {profile.revision}
        </span>
        <button type="button" className={primary} onClick={() => save.mutate()}>
          Save
        </button>
        <button type="button" className={button} onClick={() => test.mutate()}>
          {test.isPending ? "Testing…" : "Test"}
        </button>
        <button type="button" className={danger} onClick={() => remove.mutate()}>
          Delete
        </button>
      </div>
      <ErrorText error={save.error ?? remove.error ?? test.error} />
      {save.isSuccess ? <p className="text-sm text-emerald-200">saved</p> : null}
      {test.data ? <Probe result={test.data} /> : null}
    </li>
  );
}

function NewProfile({ api }: { api: Api }) {
  const client = useQueryClient();
  const [form, setForm] = useState({ name: "", model: "", api_base: "", api_key: "" });
  const create = useMutation({
    mutationFn: () =>
      api.createProfile({
        name: form.name.trim(),
        model: form.model.trim(),
        ...(form.api_base.trim() ? { api_base: form.api_base.trim() } : {}),
        ...(form.api_key ? { api_key: form.api_key } : {}),
      }),
    onSuccess: async () => {
      setForm({ name: "", model: "", api_base: "", api_key: "" });
      await client.invalidateQueries({ queryKey: ["profiles"] });
    },
  });
  const field = (k: keyof typeof form, label: string, type = "text") => (
    <label className="text-sm">
      {label}{" "}
      <input
        className={input}
        type={type}
        value={form[k]}
        autoComplete="off"
        onChange={(e) => setForm({ ...form, [k]: e.target.value })}
      />
    </label>
  );
  return (
    <form
      aria-label="New LLM profile"
      className="flex flex-wrap items-center gap-2"
      onSubmit={(e) => {
        e.preventDefault();
        create.mutate();
      }}
    >
      {field("name", "Profile name")}
      {field("model", "Model")}
      {field("api_base", "API base")}
      {field("api_key", "API key", "password")}
      <button type="submit" className={primary}>
        Add profile
      </button>
      <div className="w-full">
        <ErrorText error={create.error} />
      </div>
    </form>
  );
}

function Roles({ api, profiles }: { api: Api; profiles: Profile[] }) {
  const client = useQueryClient();
  const roles = useQuery({ queryKey: ["roles"], queryFn: () => api.roles() });
  const [chosen, setChosen] = useState<Record<string, string>>({});
  const save = useMutation({
    mutationFn: () => api.bindRoles(chosen),
    onSuccess: async () => {
      setChosen({});
      await client.invalidateQueries({ queryKey: ["roles"] });
      await client.invalidateQueries({ queryKey: ["runtime-status"] });
    },
  });
  const test = useMutation({ mutationFn: (role: string) => api.testLm({ role }) });
  const bound = new Map(roles.data?.items.map((r) => [r.role, r]));
  return (
    <section aria-labelledby="roles-h" className="flex flex-col gap-2">
      <h2 id="roles-h" className="text-lg font-semibold">
        Roles
      </h2>
      <ErrorText error={roles.error} />
      <ul className="flex flex-col gap-1 text-sm">
        {ROLES.map((role) => {
          const b = bound.get(role);
          return (
            <li key={role} className="flex items-center gap-2">
              <label className="w-64">
                {role}{" "}
                <select
                  className={input}
                  aria-label={`profile for ${role}`}
                  value={chosen[role] ?? b?.profile ?? ""}
                  onChange={(e) => setChosen({ ...chosen, [role]: e.target.value })}
                >
                  <option value="" disabled>
                    unbound
                  </option>
                  {b?.profile && !profiles.some((p) => p.name === b.profile) ? (
                    <option value={b.profile}>{b.profile} (global)</option>
                  ) : null}
                  {profiles.map((p) => (
                    <option key={p.name} value={p.name}>
                      {p.name}
                    </option>
                  ))}
                </select>
              </label>
              <span className="text-slate-300">{b?.scope ?? ""}</span>
              <button type="button" className={button} onClick={() => test.mutate(role)}>
                Test {role}
              </button>
            </li>
          );
        })}
      </ul>
      <div>
        <button
          type="button"
          className={primary}
          disabled={Object.keys(chosen).length === 0}
          onClick={() => save.mutate()}
        >
          Save roles
        </button>
      </div>
      {save.isSuccess ? <p className="text-sm text-emerald-200">roles saved</p> : null}
      <ErrorText error={save.error ?? test.error} />
      {test.data ? <Probe result={test.data} /> : null}
    </section>
  );
}

function Connectivity({ api }: { api: Api }) {
  const lm = useMutation({ mutationFn: () => api.testLm({}) });
  const daytona = useMutation({ mutationFn: () => api.testDaytona() });
  return (
    <section aria-labelledby="tests-h" className="flex flex-col gap-2">
      <h2 id="tests-h" className="text-lg font-semibold">
        Connectivity
      </h2>
      <div className="flex gap-2">
        <button type="button" className={button} onClick={() => lm.mutate()}>
          {lm.isPending ? "Testing the LM…" : "Test the LM"}
        </button>
        <button type="button" className={button} onClick={() => daytona.mutate()}>
          {daytona.isPending ? "Testing Daytona…" : "Test Daytona"}
        </button>
      </div>
      <ErrorText error={lm.error} />
      {lm.data ? <Probe result={lm.data} /> : null}
      <ErrorText error={daytona.error} />
      {daytona.data ? <Probe result={daytona.data} /> : null}
    </section>
  );
}

function RuntimeSettings({ api }: { api: Api }) {
  const client = useQueryClient();
  const settings = useQuery({ queryKey: ["settings"], queryFn: () => api.settings() });
  const [edits, setEdits] = useState<Record<string, string | null>>({});
  const save = useMutation({
    mutationFn: (updates: Record<string, string | null>) => api.patchSettings(updates),
    onSuccess: (next) => {
      setEdits({});
      client.setQueryData(["settings"], next);
    },
  });
  // a refusal names one key (`details.key`); the whole request stored nothing
  const refused = save.error instanceof ApiError ? String(save.error.details.key ?? "") : "";
  const items = settings.data?.items ?? [];
  return (
    <section aria-labelledby="settings-h" className="flex flex-col gap-2">
      <h2 id="settings-h" className="text-lg font-semibold">
        Runtime settings
      </h2>
      <p className="text-sm text-slate-300">
        Your tenant's value wins over the global one, which wins over the default; every replica
        reads them at each decision, so a change needs no restart.
      </p>
      <ErrorText error={settings.error} />
      <form
        aria-label="Runtime settings"
        className="grid grid-cols-[18rem_1fr] items-start gap-x-3 gap-y-2 text-sm"
        onSubmit={(e) => {
          e.preventDefault();
          save.mutate(edits);
        }}
      >
        {items.map((item) => {
          const id = `setting-${item.key}`;
          const value = edits[item.key] ?? item.value;
          const bad = refused === item.key;
          return (
            <div key={item.key} className="contents" data-setting={item.key}>
              <label htmlFor={id} className="flex flex-col">
                <span className="font-mono">{item.key}</span>
                <span className="text-xs text-slate-300">
                  {item.env} · from {item.source}
                  {item.source !== "default" ? ` (default ${item.default || "empty"})` : ""}
                </span>
              </label>
              <div className="flex flex-col gap-1">
                <div className="flex gap-2">
                  {item.choices.length ? (
                    <select
                      id={id}
                      className={input}
                      value={value ?? ""}
                      aria-invalid={bad || undefined}
                      onChange={(e) => setEdits({ ...edits, [item.key]: e.target.value })}
                    >
                      {item.choices.map((c) => (
                        <option key={c} value={c}>
                          {c}
                        </option>
                      ))}
                    </select>
                  ) : (
                    <input
                      id={id}
                      className={`${input} ${bad ? "border-red-500" : ""}`}
                      inputMode={item.integer ? "numeric" : undefined}
                      aria-invalid={bad || undefined}
                      aria-describedby={`${id}-help`}
                      value={value ?? ""}
                      onChange={(e) => setEdits({ ...edits, [item.key]: e.target.value })}
                    />
                  )}
                  {item.tenant_value != null ? (
                    <button
                      type="button"
                      className={button}
                      onClick={() => save.mutate({ [item.key]: null })}
                    >
                      Use {item.global_value != null ? "the global value" : "the default"}
                    </button>
                  ) : null}
                </div>
                <span id={`${id}-help`} className="text-xs text-slate-300">
                  {item.description}
                </span>
                {bad && save.error instanceof Error ? (
                  <span role="alert" className="text-red-300">
                    {save.error.message}
                  </span>
                ) : null}
              </div>
            </div>
          );
        })}
        {items.length ? (
          <div className="col-span-2">
            <button type="submit" className={primary} disabled={!Object.keys(edits).length}>
              Save settings
            </button>
          </div>
        ) : null}
      </form>
      {save.isSuccess ? <p className="text-sm text-emerald-200">settings saved</p> : null}
      {save.error && !refused ? <ErrorText error={save.error} /> : null}
    </section>
  );
}

export function SettingsPage() {
  const { api } = useAuth();
  const profiles = useQuery({
    queryKey: ["profiles"],
    queryFn: () => (api as NonNullable<typeof api>).profiles(),
    enabled: Boolean(api),
  });
  if (!api) return null;
  return (
    <Shell>
      <div className="flex flex-1 flex-col gap-6 overflow-auto p-4">
        <Status api={api} />
        <section aria-labelledby="profiles-h" className="flex flex-col gap-2">
          <h2 id="profiles-h" className="text-lg font-semibold">
            LLM profiles
          </h2>
          <ErrorText error={profiles.error} />
          <ul className="flex flex-col gap-2">
            {profiles.data?.items.map((p) => (
              <ProfileRow key={`${p.name}:${p.revision}`} api={api} profile={p} />
            ))}
          </ul>
          <NewProfile api={api} />
        </section>
        <Roles api={api} profiles={profiles.data?.items ?? []} />
        <Connectivity api={api} />
        <RuntimeSettings api={api} />
      </div>
    </Shell>
  );
}
