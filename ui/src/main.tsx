import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import {
  createRootRoute,
  createRoute,
  createRouter,
  Navigate,
  Outlet,
  RouterProvider,
} from "@tanstack/react-router";
import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import { AuthProvider, useAuth } from "./app/auth";
import { Login } from "./app/Login";
import { Workspace } from "./app/Workspace";
import "./index.css";

function Guard({ session }: { session: string | null }) {
  const { api } = useAuth();
  return api ? <Workspace session={session} /> : <Navigate to="/" />;
}

function Home() {
  const { api } = useAuth();
  return api ? <Navigate to="/workspace" /> : <Login />;
}

const root = createRootRoute({ component: Outlet });
const home = createRoute({ getParentRoute: () => root, path: "/", component: Home });
const workspace = createRoute({
  getParentRoute: () => root,
  path: "/workspace",
  component: () => <Guard session={null} />,
});
const session = createRoute({
  getParentRoute: () => root,
  path: "/workspace/$sessionId",
  component: function SessionRoute() {
    const { sessionId } = session.useParams();
    return <Guard session={sessionId} />;
  },
});
const router = createRouter({ routeTree: root.addChildren([home, workspace, session]) });

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
