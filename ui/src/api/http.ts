// The gateway's HTTP API. Every failure becomes an ApiError with the gateway's own code and
// message (docs/gateway.md, "error codes"), so the screen can say exactly what went wrong.
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

export interface SessionOut {
  id: string;
  title: string;
  owner: string;
  status: "active" | "deleted";
  created_at: string;
  updated_at: string;
  turn_count: number;
  active_turn: string | null;
  created_seq: number;
  last_seq: number;
}

export interface SessionPage {
  items: SessionOut[];
  next_cursor: string | null;
  seq: number;
}

export interface Me {
  tenant: string;
  user: string;
  admin: boolean;
}

export interface WsTicket {
  ticket: string;
  expires_at: string;
  ttl_s: number;
}

export interface AuditFault {
  subject: string;
  seq: number;
  event_id: string;
  reason: string;
}

export interface Audit {
  session_id: string;
  ok: boolean;
  checked: number;
  signatures: boolean;
  require_signatures: boolean;
  fault: AuditFault | null;
}

export interface Imported {
  session_id: string;
  seq: number;
  source_session: string;
  source_head_hash: string;
  events: number;
  blobs: number;
}

export interface Restored {
  session_id: string;
  seq: number;
  upto_seq: number;
  sandbox?: string | null;
  replaced?: string | null;
  sandbox_error?: string | null;
}

export interface TurnOut {
  id: string;
  turn_index: number;
  user_message: string;
  assistant_message: string;
  mode: string;
  status: string;
  error: string;
  created_at: string;
  ended_at: string | null;
  requested_seq: number;
  last_seq: number;
}

export interface SessionStats {
  session: string;
  total_calls: number;
  total_tokens_in: number;
  total_tokens_out: number;
  total_latency_ms: number;
  total_cost: number;
  turns: number;
  turn_latency_ms: number;
  model_breakdown: {
    model: string;
    calls: number;
    errors: number;
    tokens_in: number;
    tokens_out: number;
    latency_ms: number;
    cost: number;
  }[];
}

export interface Uploaded {
  alias: string;
  size: number;
  chars: number;
  seq: number;
}

export interface Sandbox {
  sandbox: string;
  provider: string;
  replica: string;
  status: string;
  parent?: string | null;
  labels?: Record<string, string>;
  contexts?: string[];
  stopped_reason?: string | null;
  capabilities?: Record<string, boolean> | null;
  volume?: string | null;
  volume_subpath?: string | null;
  repo_url?: string | null;
  ref?: string | null;
  context_paths?: string[];
}

export interface Profile {
  name: string;
  model: string;
  api_base: string | null;
  timeout_s: number;
  max_tokens: number | null;
  temperature: number | null;
  has_api_key: boolean;
  revision: number;
}

export interface ProfileIn {
  name?: string;
  model?: string;
  api_base?: string | null;
  api_key?: string;
  timeout_s?: number;
  max_tokens?: number | null;
  temperature?: number | null;
}

export const ROLES = ["planner", "delegate", "delegate_small", "reflection"] as const;

export interface RoleBinding {
  role: string;
  profile: string | null;
  scope: "tenant" | "global" | "unbound";
}

export interface ProbeResult {
  kind: string;
  ok: boolean;
  preflight_ok: boolean;
  checked_at: string;
  checks: { name: string; ok: boolean; detail?: string }[];
  guidance: string[];
  latency_ms: number | null;
  output_preview: string;
  error: string;
  profile?: string | null;
  model?: string | null;
}

export interface RuntimeStatus {
  ready: boolean;
  llm_ready: boolean;
  agent_replica: string | null;
  roles: {
    role: string;
    profile: string | null;
    model?: string | null;
    api_base?: string | null;
    has_api_key?: boolean;
    api_key_found?: boolean;
    problem?: string;
  }[];
  guidance: string[];
  components: { name: string; kind: string; state: string; detail?: string }[];
}

export interface RuntimeSetting {
  key: string;
  env: string;
  description: string;
  value: string;
  source: "tenant" | "global" | "default";
  default: string;
  choices: string[];
  integer: boolean;
  tenant_value: string | null;
  global_value: string | null;
  secret: boolean;
}

/** `GET /runtime/settings` (fleet_gateway.routes.settings). */
export interface RuntimeSettings {
  tenant: string;
  can_edit_global: boolean;
  items: RuntimeSetting[];
}

export interface VolumeTree {
  volume: string;
  path: string;
  entries: { name: string; kind: "file" | "dir" | "other"; size: number }[];
  truncated: boolean;
}

export interface VolumeFile {
  volume: string;
  path: string;
  bytes: number;
  sha256: string;
  truncated: boolean;
  encoding: "utf-8" | "base64";
  content: string;
}

export type Fetch = typeof fetch;

/** An XMLHttpRequest-shaped upload (the one browser API that reports upload progress). */
export type Uploader = (
  url: string,
  token: string,
  body: FormData,
  onProgress: (loaded: number, total: number) => void,
) => Promise<{ status: number; text: string }>;

export const xhrUpload: Uploader = (url, token, body, onProgress) =>
  new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", url);
    xhr.setRequestHeader("authorization", `Bearer ${token}`);
    xhr.upload.onprogress = (e) => onProgress(e.loaded, e.lengthComputable ? e.total : 0);
    xhr.onload = () => resolve({ status: xhr.status, text: xhr.responseText });
    xhr.onerror = () => reject(new Error("the upload was interrupted"));
    xhr.send(body);
  });

function failure(status: number, statusText: string, text: string): ApiError {
  let parsed: { code?: string; message?: string; details?: unknown } = {};
  try {
    parsed = text ? JSON.parse(text) : {};
  } catch {
    parsed = {};
  }
  if (status === 404 && parsed.code === "route_not_found")
    return new ApiError(
      404,
      "route_not_found",
      `this gateway has no such route yet (${parsed.message ?? statusText})`,
    );
  return new ApiError(
    status,
    parsed.code ?? `http_${status}`,
    parsed.message ?? (text.slice(0, 300) || statusText),
    (parsed.details as Record<string, unknown>) ?? {},
  );
}

export class Api {
  constructor(
    readonly token: string,
    private readonly fetcher: Fetch = (...args) => fetch(...args),
    private readonly base = "",
  ) {}

  private async raw(
    method: string,
    path: string,
    body?: BodyInit,
    type?: string,
  ): Promise<{ text: string; response: Response }> {
    let response: Response;
    try {
      response = await this.fetcher(`${this.base}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${this.token}`,
          ...(type ? { "content-type": type } : {}),
        },
        body,
      });
    } catch (error) {
      throw new ApiError(0, "gateway_unreachable", `the gateway did not answer: ${String(error)}`);
    }
    const text = await response.text();
    if (!response.ok) throw failure(response.status, response.statusText, text);
    return { text, response };
  }

  private async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const { text } = await this.raw(
      method,
      path,
      body === undefined ? undefined : JSON.stringify(body),
      body === undefined ? undefined : "application/json",
    );
    try {
      return (text ? JSON.parse(text) : null) as T;
    } catch {
      throw new ApiError(200, "malformed_response", `the gateway answered ${text.slice(0, 200)}`);
    }
  }

  me(): Promise<Me> {
    return this.call("GET", "/api/v1/auth/me");
  }

  wsTicket(): Promise<WsTicket> {
    return this.call("POST", "/api/v1/auth/ws-ticket");
  }

  sessions(query = ""): Promise<SessionPage> {
    const q = query ? `?search=${encodeURIComponent(query)}&limit=100` : "?limit=100";
    return this.call("GET", `/api/v1/sessions${q}`);
  }

  createSession(title: string): Promise<{ seq: number; session: SessionOut }> {
    return this.call("POST", "/api/v1/sessions", { title });
  }

  /** `minSeq`: read a write of ours back (the replica waits, bounded, until it folded it). */
  session(id: string, minSeq?: number): Promise<SessionOut> {
    const after = minSeq ? `?min_seq=${minSeq}` : "";
    return this.call("GET", `/api/v1/sessions/${encodeURIComponent(id)}${after}`);
  }

  renameSession(id: string, title: string): Promise<{ seq: number }> {
    return this.call("PATCH", `/api/v1/sessions/${encodeURIComponent(id)}`, { title });
  }

  turns(id: string): Promise<{ items: TurnOut[]; next_cursor: string | null }> {
    return this.call("GET", `/api/v1/sessions/${encodeURIComponent(id)}/turns?limit=200`);
  }

  stats(id: string): Promise<SessionStats> {
    return this.call("GET", `/api/v1/sessions/${encodeURIComponent(id)}/stats`);
  }

  audit(id: string): Promise<Audit> {
    return this.call("GET", `/api/v1/sessions/${encodeURIComponent(id)}/audit`);
  }

  restore(id: string, uptoSeq?: number): Promise<Restored> {
    return this.call("POST", `/api/v1/sessions/${encodeURIComponent(id)}/restore`, {
      ...(uptoSeq ? { upto_seq: uptoSeq } : {}),
      reason: "restored from the Sessions screen",
    });
  }

  /** The export's JSON lines, verbatim (what `fleet audit verify FILE` checks). */
  async exportSession(id: string): Promise<string> {
    return (await this.raw("POST", `/api/v1/sessions/${encodeURIComponent(id)}/export`)).text;
  }

  async importSession(lines: string): Promise<Imported> {
    const { text } = await this.raw(
      "POST",
      "/api/v1/sessions/import",
      lines,
      "application/x-ndjson",
    );
    return JSON.parse(text) as Imported;
  }

  async uploadDocument(
    session: string,
    file: File,
    onProgress: (loaded: number, total: number) => void,
    upload: Uploader = xhrUpload,
  ): Promise<Uploaded> {
    const form = new FormData();
    form.append("file", file, file.name);
    let answer: { status: number; text: string };
    try {
      answer = await upload(
        `${this.base}/api/v1/sessions/${encodeURIComponent(session)}/documents`,
        this.token,
        form,
        onProgress,
      );
    } catch (error) {
      throw new ApiError(0, "upload_failed", `${file.name}: ${String(error)}`);
    }
    if (answer.status < 200 || answer.status >= 300)
      throw failure(answer.status, `HTTP ${answer.status}`, answer.text);
    return JSON.parse(answer.text) as Uploaded;
  }

  sandboxes(session = ""): Promise<{ items: Sandbox[]; next_cursor: string | null }> {
    const q = session ? `?session=${encodeURIComponent(session)}` : "";
    return this.call("GET", `/api/v1/sandboxes${q}`);
  }

  sandbox(id: string): Promise<Sandbox> {
    return this.call("GET", `/api/v1/sandboxes/${encodeURIComponent(id)}`);
  }

  deleteSandbox(id: string): Promise<{ sandbox: string; deleted: boolean }> {
    return this.call("DELETE", `/api/v1/sandboxes/${encodeURIComponent(id)}`);
  }

  archiveSandbox(id: string): Promise<Record<string, unknown>> {
    return this.call("POST", `/api/v1/sandboxes/${encodeURIComponent(id)}/archive`);
  }

  volumeTree(volume: string, path: string): Promise<VolumeTree> {
    const q = new URLSearchParams({ volume, path });
    return this.call("GET", `/api/v1/runtime/volume/tree?${q}`);
  }

  volumeFile(volume: string, path: string): Promise<VolumeFile> {
    const q = new URLSearchParams({ volume, path });
    return this.call("GET", `/api/v1/runtime/volume/file?${q}`);
  }

  runtimeStatus(): Promise<RuntimeStatus> {
    return this.call("GET", "/api/v1/runtime/status");
  }

  settings(): Promise<RuntimeSettings> {
    return this.call("GET", "/api/v1/runtime/settings");
  }

  /** `null` clears the tenant's value (the global one or the default applies again). */
  patchSettings(updates: Record<string, string | null>): Promise<RuntimeSettings> {
    return this.call("PATCH", "/api/v1/runtime/settings", { updates, scope: "tenant" });
  }

  profiles(): Promise<{ items: Profile[] }> {
    return this.call("GET", "/api/v1/runtime/llm-profiles");
  }

  createProfile(body: ProfileIn): Promise<Profile> {
    return this.call("POST", "/api/v1/runtime/llm-profiles", body);
  }

  patchProfile(name: string, body: ProfileIn): Promise<Profile> {
    return this.call("PATCH", `/api/v1/runtime/llm-profiles/${encodeURIComponent(name)}`, body);
  }

  deleteProfile(name: string): Promise<{ name: string; deleted: boolean }> {
    return this.call("DELETE", `/api/v1/runtime/llm-profiles/${encodeURIComponent(name)}`);
  }

  roles(): Promise<{ items: RoleBinding[] }> {
    return this.call("GET", "/api/v1/runtime/llm-roles");
  }

  bindRoles(roles: Record<string, string>): Promise<{ items: RoleBinding[] }> {
    return this.call("PATCH", "/api/v1/runtime/llm-roles", { roles });
  }

  testLm(body: { role?: string; profile?: string }): Promise<ProbeResult> {
    return this.call("POST", "/api/v1/runtime/tests/lm", body);
  }

  testDaytona(): Promise<ProbeResult> {
    return this.call("POST", "/api/v1/runtime/tests/daytona", {});
  }
}
