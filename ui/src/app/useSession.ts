// One session's live state: the socket, every event frame in stream order (the time-travel
// source) and the folded view. Frames arrive in batches per animation frame so a fast turn
// costs one render per frame, not one per event.
import { useCallback, useEffect, useRef, useState } from "react";
import type { Api } from "../api/http";
import { SessionSocket, type SocketState, type WsLike } from "../api/socket";
import { fold, foldDelta } from "../model/fold";
import type { ErrorFrame, EventFrame } from "../model/frames";
import { emptyView, type ViewModel } from "../model/view";
import { frameBatcher } from "./feed";

export interface SessionFeed {
  view: ViewModel;
  frames: EventFrame[];
  state: SocketState;
  errors: (ErrorFrame & { id: number })[];
  send: (frame: Record<string, unknown>) => void;
  dismiss: (id: number) => void;
}

function wsBase(): string {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}`;
}

export function useSession(api: Api, session: string): SessionFeed {
  const [view, setView] = useState<ViewModel>(emptyView);
  const [frames, setFrames] = useState<EventFrame[]>([]);
  const [state, setState] = useState<SocketState>({ kind: "connecting" });
  const [errors, setErrors] = useState<(ErrorFrame & { id: number })[]>([]);
  const errorIds = useRef(0);
  const socket = useRef<SessionSocket | null>(null);

  useEffect(() => {
    setView(emptyView());
    setFrames([]);
    setErrors([]);
    const batches = frameBatcher((batch) => {
      setView((v) => fold(v, batch));
      setFrames((all) => all.concat(batch));
    });
    const s = new SessionSocket(
      session,
      0,
      {
        ticket: async () => (await api.wsTicket()).ticket,
        // The browser socket calls these handlers with richer events than WsLike names.
        open: (url) => new WebSocket(url) as unknown as WsLike,
        later: (fn, ms) => window.setTimeout(fn, ms),
        base: wsBase(),
      },
      {
        onFrames: (batch) => batches.push(batch),
        onFrame: (frame) => {
          if (frame.type === "delta") setView((v) => foldDelta(v, frame));
          else if (frame.type === "error")
            setErrors((e) => [...e, { ...frame, id: ++errorIds.current }]);
        },
        onState: setState,
      },
    );
    socket.current = s;
    s.start();
    return () => {
      s.stop();
      batches.cancel();
      socket.current = null;
    };
  }, [api, session]);

  const send = useCallback((frame: Record<string, unknown>) => socket.current?.send(frame), []);
  const dismiss = useCallback((id: number) => setErrors((e) => e.filter((x) => x.id !== id)), []);
  return { view, frames, state, errors, send, dismiss };
}
