import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import {
  createRootRoute,
  createRoute,
  createRouter,
  Navigate,
  Outlet,
  RouterProvider,
} from "@tanstack/react-router";
import { lazy, type ReactNode, StrictMode, Suspense } from "react";
import { createRoot } from "react-dom/client";
import { AuthProvider, useAuth } from "./app/auth";
import { Login } from "./app/Login";
import { SandboxesPage } from "./app/SandboxesPage";
import { SessionsPage } from "./app/SessionsPage";
import { SettingsPage } from "./app/SettingsPage";
import { VolumesPage } from "./app/VolumesPage";
import { Workspace } from "./app/Workspace";
import "./index.css";

function Guard({ children }: { children: ReactNode }) {
  const { api } = useAuth();
  return api ? children : <Navigate to="/" />;
}

const seqParam = (value: unknown): number | undefined => {
  const n = Number(value);
  return Number.isInteger(n) && n > 0 ? n : undefined;
};

function Home() {
  const { api } = useAuth();
  return api ? <Navigate to="/workspace" /> : <Login />;
}

const root = createRootRoute({ component: Outlet });
const home = createRoute({ getParentRoute: () => root, path: "/", component: Home });
const workspace = createRoute({
  getParentRoute: () => root,
  path: "/workspace",
  component: () => (
    <Guard>
      <Workspace session={null} />
    </Guard>
  ),
});
const session = createRoute({
  getParentRoute: () => root,
  path: "/workspace/$sessionId",
  validateSearch: (search: Record<string, unknown>): { at?: number } => ({
    at: seqParam(search.at),
  }),
  component: function SessionRoute() {
    const { sessionId } = session.useParams();
    const { at } = session.useSearch();
    return (
      <Guard>
        <Workspace session={sessionId} at={at} />
      </Guard>
    );
  },
});
const sessions = createRoute({
  getParentRoute: () => root,
  path: "/sessions",
  validateSearch: (search: Record<string, unknown>): { id?: string } => ({
    id: typeof search.id === "string" && search.id ? search.id : undefined,
  }),
  component: function SessionsRoute() {
    const { id } = sessions.useSearch();
    return (
      <Guard>
        <SessionsPage selected={id} />
      </Guard>
    );
  },
});
const screen = <P extends string>(path: P, Page: () => ReactNode) =>
  createRoute({
    getParentRoute: () => root,
    path,
    component: () => (
      <Guard>
        <Page />
      </Guard>
    ),
  });
const Bench = lazy(() => import("./bench/BenchPage").then((m) => ({ default: m.BenchPage })));
const bench = createRoute({
  getParentRoute: () => root,
  path: "/bench",
  component: () => (
    <Suspense fallback={<p>loading the benchmark…</p>}>
      <Bench />
    </Suspense>
  ),
});
const router = createRouter({
  routeTree: root.addChildren([
    home,
    workspace,
    session,
    sessions,
    screen("/sandboxes", SandboxesPage),
    screen("/volumes", VolumesPage),
    screen("/settings", SettingsPage),
    bench,
  ]),
});

declare module "@tanstack/react-router" {
  interface Register {
    router: typeof router;
  }
}

const queries = new QueryClient({ defaultOptions: { queries: { retry: 1 } } });
const mount = document.getElementById("root");
if (mount)
  createRoot(mount).render(
    <StrictMode>
      <QueryClientProvider client={queries}>
        <AuthProvider>
          <RouterProvider router={router} />
        </AuthProvider>
      </QueryClientProvider>
    </StrictMode>,
  );
