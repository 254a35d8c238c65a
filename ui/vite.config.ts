import tailwindcss from "@tailwindcss/vite";
import react from "@vitejs/plugin-react";
import { defineConfig } from "vitest/config";

// The dev server forwards the API and the sockets to a gateway started by ./scripts/run, so
// `npm run dev` talks to the same mesh the built UI is served from.
const gateway = process.env.FLEET_GATEWAY_URL ?? "http://127.0.0.1:8080";

export default defineConfig({
  plugins: [react(), tailwindcss()],
  server: { proxy: { "/api": { target: gateway, ws: true } } },
  // One bundle (~540 kB, 175 kB gzipped) for a tool served from the same host; splitting it
  // buys little until the Settings and Volumes screens arrive.
  build: { outDir: "dist", sourcemap: true, chunkSizeWarningLimit: 800 },
  test: {
    environment: "node",
    include: ["src/**/*.test.ts", "src/**/*.test.tsx"],
    benchmark: { include: ["bench/**/*.bench.ts"] },
  },
});
