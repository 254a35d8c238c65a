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

export type Fetch = typeof fetch;

export class Api {
  constructor(
    readonly token: string,
    private readonly fetcher: Fetch = (...args) => fetch(...args),
    private readonly base = "",
  ) {}

  private async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    let response: Response;
    try {
      response = await this.fetcher(`${this.base}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${this.token}`,
          ...(body === undefined ? {} : { "content-type": "application/json" }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (error) {
      throw new ApiError(0, "gateway_unreachable", `the gateway did not answer: ${String(error)}`);
    }
    const text = await response.text();
    let parsed: unknown = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      parsed = null;
    }
    if (!response.ok) {
      const err = (parsed ?? {}) as { code?: string; message?: string; details?: unknown };
      throw new ApiError(
        response.status,
        err.code ?? `http_${response.status}`,
        err.message ?? (text.slice(0, 300) || response.statusText),
        (err.details as Record<string, unknown>) ?? {},
      );
    }
    return parsed as T;
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
}
