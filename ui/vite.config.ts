import tailwindcss from "@tailwindcss/vite";
import react from "@vitejs/plugin-react";
import { defineConfig } from "vitest/config";

// The dev server forwards the API and the sockets to a gateway started by ./scripts/run, so
// `npm run dev` talks to the same mesh the built UI is served from.
const gateway = process.env.FLEET_GATEWAY_URL ?? "http://127.0.0.1:8080";

export default defineConfig({
  plugins: [react(), tailwindcss()],
  server: { proxy: { "/api": { target: gateway, ws: true } } },
  // The app (~590 kB, 185 kB gzipped) for a tool served from the same host, plus two chunks
  // loaded on first use: Shiki with its Python grammar (~250 kB) and the /bench page.
  build: { outDir: "dist", sourcemap: true, chunkSizeWarningLimit: 800 },
  test: {
    environment: "node",
    include: ["src/**/*.test.ts", "src/**/*.test.tsx"],
    benchmark: { include: ["bench/**/*.bench.ts"] },
  },
});
