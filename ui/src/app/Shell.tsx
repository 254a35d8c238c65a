// The frame every signed-in screen shares: the product name, the screens, sign out.
import { Link } from "@tanstack/react-router";
import type { ReactNode } from "react";
import { useAuth } from "./auth";

const SCREENS = [
  ["/workspace", "Workspace"],
  ["/sessions", "Sessions"],
  ["/sandboxes", "Sandboxes"],
  ["/volumes", "Volumes"],
  ["/settings", "Settings"],
] as const;

export function Shell({ children }: { children: ReactNode }) {
  const { signOut } = useAuth();
  return (
    <div className="flex h-screen flex-col">
      <header className="flex items-center gap-4 border-b border-slate-700 px-3 py-2">
        <h1 className="font-semibold">fleet-rlm</h1>
        <nav aria-label="Screens" className="flex flex-1 gap-1">
          {SCREENS.map(([to, label]) => (
            <Link
              key={to}
              to={to}
              className="rounded px-2 py-1 text-slate-200 hover:bg-slate-800"
              activeProps={{ className: "bg-slate-800 text-white", "aria-current": "page" }}
            >
              {label}
            </Link>
          ))}
        </nav>
        <button type="button" className="text-sm underline" onClick={signOut}>
          Sign out
        </button>
      </header>
      <div className="flex min-h-0 flex-1">{children}</div>
    </div>
  );
}

export const button =
  "rounded bg-slate-700 px-3 py-1 text-sm text-white hover:bg-slate-600 disabled:text-slate-300";
export const primary =
  "rounded bg-sky-700 px-3 py-1 text-sm font-medium text-white hover:bg-sky-600 disabled:bg-slate-700 disabled:text-slate-300";
export const danger =
  "rounded bg-red-800 px-3 py-1 text-sm font-medium text-white hover:bg-red-700";
export const input = "rounded border border-slate-600 bg-slate-900 p-1 text-slate-100";
