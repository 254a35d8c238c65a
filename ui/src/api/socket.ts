// The execution socket with resume. Every event frame carries its stream sequence; after a
// drop the client asks for a fresh ticket and reopens with `after_seq` = the last sequence it
// folded, so it gets exactly what it missed. The reducer ignores anything at or below that
// sequence as well, so even an overlapping resend cannot show an event twice.
import type { EventFrame, ServerFrame } from "../model/frames";

export type SocketState =
  | { kind: "connecting" }
  | { kind: "open"; resumedFrom: number | null }
  | { kind: "reconnecting"; attempt: number; lastSeq: number; reason: string }
  | { kind: "closed"; reason: string };

/** The slice of the browser WebSocket this client uses (so tests can drive it). */
export interface WsLike {
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}

export interface SocketDeps {
  ticket: () => Promise<string>;
  open: (url: string) => WsLike;
  /** Schedules a reconnect; the browser's setTimeout, a manual clock in tests. */
  later: (fn: () => void, ms: number) => void;
  base: string;
}

export interface SocketHandlers {
  onFrames: (frames: EventFrame[]) => void;
  onFrame: (frame: Exclude<ServerFrame, EventFrame>) => void;
  onState: (state: SocketState) => void;
}

const FATAL = new Set([1008]); // a bad URL: reconnecting would only repeat it
const MAX_ATTEMPTS = 8;

export class SessionSocket {
  private ws: WsLike | null = null;
  private lastSeq: number;
  private attempt = 0;
  private stopped = false;
  private outbox: string[] = [];

  constructor(
    private readonly session: string,
    afterSeq: number,
    private readonly deps: SocketDeps,
    private readonly on: SocketHandlers,
  ) {
    this.lastSeq = afterSeq;
  }

  get seq(): number {
    return this.lastSeq;
  }

  start(): void {
    void this.connect(false);
  }

  stop(): void {
    this.stopped = true;
    this.ws?.close(1000, "left");
    this.ws = null;
  }

  /** Sends now when open, else when the socket (re)opens: a frame is never silently lost. */
  send(frame: Record<string, unknown>): void {
    const text = JSON.stringify(frame);
    if (this.ws && this.isOpen) this.ws.send(text);
    else this.outbox.push(text);
  }

  private isOpen = false;

  private async connect(resuming: boolean): Promise<void> {
    if (this.stopped) return;
    this.on.onState(
      resuming
        ? { kind: "reconnecting", attempt: this.attempt, lastSeq: this.lastSeq, reason: "" }
        : { kind: "connecting" },
    );
    let ticket: string;
    try {
      ticket = await this.deps.ticket();
    } catch (error) {
      this.retry(`no ticket: ${error instanceof Error ? error.message : String(error)}`);
      return;
    }
    if (this.stopped) return;
    const query = new URLSearchParams({
      ticket,
      session_id: this.session,
      after_seq: String(this.lastSeq),
      trace_mode: "verbose",
    });
    const from = this.lastSeq;
    const ws = this.deps.open(`${this.deps.base}/api/v1/ws/execution?${query}`);
    this.ws = ws;
    ws.onopen = () => {
      this.isOpen = true;
      this.attempt = 0;
      this.on.onState({ kind: "open", resumedFrom: resuming ? from : null });
      for (const text of this.outbox.splice(0)) ws.send(text);
    };
    ws.onmessage = (ev) => this.receive(ev.data);
    ws.onerror = () => {};
    ws.onclose = (ev) => {
      this.isOpen = false;
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.stopped) return;
      const reason = describeClose(ev.code, ev.reason);
      if (FATAL.has(ev.code)) {
        this.on.onState({ kind: "closed", reason });
        return;
      }
      this.retry(reason);
    };
  }

  private retry(reason: string): void {
    if (this.stopped) return;
    this.attempt += 1;
    if (this.attempt > MAX_ATTEMPTS) {
      this.on.onState({ kind: "closed", reason: `gave up after ${MAX_ATTEMPTS} tries: ${reason}` });
      return;
    }
    this.on.onState({
      kind: "reconnecting",
      attempt: this.attempt,
      lastSeq: this.lastSeq,
      reason,
    });
    const wait = Math.min(8000, 250 * 2 ** (this.attempt - 1));
    this.deps.later(() => void this.connect(true), wait);
  }

  private receive(raw: unknown): void {
    if (typeof raw !== "string") return;
    let frame: ServerFrame;
    try {
      frame = JSON.parse(raw) as ServerFrame;
    } catch {
      this.on.onFrame({
        type: "error",
        code: "malformed_server_frame",
        message: raw.slice(0, 200),
      });
      return;
    }
    if (frame.type === "event") {
      if (frame.seq <= this.lastSeq) return;
      this.lastSeq = frame.seq;
      this.on.onFrames([frame]);
      return;
    }
    this.on.onFrame(frame);
  }
}

export function describeClose(code: number, reason: string): string {
  let detail = reason;
  try {
    const parsed = JSON.parse(reason) as { code?: string; last_seq?: number };
    if (parsed.code) detail = parsed.code;
  } catch {
    // a plain-text reason is shown as it came
  }
  const known: Record<number, string> = {
    1006: "connection lost",
    1011: "the gateway's watch failed",
    4008: "the socket fell behind (queue overflow)",
    4401: "the ticket was refused",
  };
  return `${known[code] ?? `closed (${code})`}${detail ? `: ${detail}` : ""}`;
}
