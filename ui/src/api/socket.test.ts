// The socket's resume logic against a scripted stand-in for the browser WebSocket (a fake,
// named as such: the real socket is exercised by the gateway's own tests).
import { describe, expect, it } from "vitest";
import { Log } from "../model/fixtures";
import type { EventFrame } from "../model/frames";
import { SessionSocket, type SocketState, type WsLike } from "./socket";

class FakeWs implements WsLike {
  onopen: WsLike["onopen"] = null;
  onmessage: WsLike["onmessage"] = null;
  onclose: WsLike["onclose"] = null;
  onerror: WsLike["onerror"] = null;
  sent: string[] = [];
  constructor(readonly url: string) {}
  send(data: string) {
    this.sent.push(data);
  }
  close() {}
  deliver(frame: EventFrame) {
    this.onmessage?.({ data: JSON.stringify(frame) });
  }
}

function harness() {
  const sockets: FakeWs[] = [];
  const timers: (() => void)[] = [];
  const folded: number[] = [];
  const states: SocketState[] = [];
  let tickets = 0;
  const socket = new SessionSocket(
    "s1",
    0,
    {
      ticket: async () => `tk${++tickets}`,
      open: (url) => {
        const ws = new FakeWs(url);
        sockets.push(ws);
        return ws;
      },
      later: (fn) => timers.push(fn),
      base: "ws://gw",
    },
    {
      onFrames: (frames) => folded.push(...frames.map((f) => f.seq)),
      onFrame: () => {},
      onState: (s) => states.push(s),
    },
  );
  return { socket, sockets, timers, folded, states };
}

const flush = () => new Promise((r) => setTimeout(r, 0));

describe("SessionSocket", () => {
  it("resumes after a drop from the last sequence with a new ticket and shows no duplicate", async () => {
    const log = new Log();
    for (let i = 0; i < 6; i++) log.add({ type: "session.renamed", title: `t${i}` });
    const h = harness();
    h.socket.start();
    await flush();
    const first = h.sockets[0] as FakeWs;
    expect(first.url).toBe(
      "ws://gw/api/v1/ws/execution?ticket=tk1&session_id=s1&after_seq=0&trace_mode=verbose",
    );
    first.onopen?.({});
    for (const f of log.frames.slice(0, 3)) first.deliver(f);
    first.onclose?.({ code: 1006, reason: "" });
    expect(h.states.at(-1)).toMatchObject({ kind: "reconnecting", attempt: 1, lastSeq: 3 });
    h.timers.shift()?.();
    await flush();
    const second = h.sockets[1] as FakeWs;
    expect(new URL(second.url).searchParams.get("after_seq")).toBe("3");
    expect(new URL(second.url).searchParams.get("ticket")).toBe("tk2");
    second.onopen?.({});
    expect(h.states.at(-1)).toEqual({ kind: "open", resumedFrom: 3 });
    for (const f of log.frames.slice(1)) second.deliver(f); // overlaps 2..3
    expect(h.folded).toEqual([1, 2, 3, 4, 5, 6]);
  });

  it("holds frames sent while down and sends them once reopened", async () => {
    const h = harness();
    h.socket.start();
    await flush();
    h.socket.send({ type: "message", content: "hi", session_id: "s1" });
    const ws = h.sockets[0] as FakeWs;
    expect(ws.sent).toEqual([]);
    ws.onopen?.({});
    expect(ws.sent.map((s) => JSON.parse(s).content)).toEqual(["hi"]);
  });

  it("stops on a policy close instead of repeating a bad URL, and says why", async () => {
    const h = harness();
    h.socket.start();
    await flush();
    (h.sockets[0] as FakeWs).onclose?.({ code: 1008, reason: '{"code":"invalid_query"}' });
    expect(h.timers).toHaveLength(0);
    expect(h.states.at(-1)).toEqual({ kind: "closed", reason: "closed (1008): invalid_query" });
  });
});
