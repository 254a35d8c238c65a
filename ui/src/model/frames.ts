// The gateway's WebSocket frames (docs/websocket.md). Only `event` frames carry a sequence;
// deltas are unpersisted previews that the stored event later supersedes.
import type { Envelope } from "../generated/events";

export type EventData = Envelope["data"];

export interface EventFrame {
  type: "event";
  seq: number;
  subject: string;
  hash: string;
  event: Envelope;
  truncated?: boolean;
}

export interface DeltaFrame {
  type: "delta";
  kind: string;
  run: string | null;
  text: string;
}

export interface AcceptedFrame {
  type: "accepted";
  frame: "message" | "cancel" | "command";
  session_id: string;
  turn_id: string | null;
  seq: number;
}

export interface ErrorFrame {
  type: "error";
  code: string;
  message: string;
  details?: Record<string, unknown>;
}

export type ServerFrame = EventFrame | DeltaFrame | AcceptedFrame | ErrorFrame;

/** Narrow one event's payload by its wire tag without a cast at every call site. */
export type DataOf<T extends EventData["type"]> = Extract<EventData, { type: T }>;
