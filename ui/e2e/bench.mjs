// Drives the in-browser benchmark page (/bench of a server holding ui/dist) in Debian's headless
// chromium and prints one JSON object: frame times of a live turn and time-travel step times,
// for the project (the panels render) and the baseline (the same fold, no render), in
// interleaved rounds. Usage: node e2e/bench.mjs <url> <json options>; run by bench/ui.py.
import { chromium } from "playwright-core";

const [url, raw = "{}"] = process.argv.slice(2);
const opt = {
  events: 2000,
  overMs: 4000,
  session: 10000,
  steps: 20,
  rounds: 3,
  ...JSON.parse(raw),
};
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
const errors = [];
page.on("pageerror", (e) => errors.push(e.message));
await page.goto(`${url}/bench`);
await page.waitForFunction(() => "fleetBench" in window, null, { timeout: 30000 });
// the steps: first, last, middle, and spread over the session
const steps = [0, opt.session - 1, Math.floor(opt.session / 2)];
for (let i = 1; steps.length < opt.steps; i++) steps.push(Math.floor((i * 7919) % opt.session));
const out = {
  options: opt,
  live: { baseline: [], project: [] },
  burst: { baseline: [], project: [] },
  tree: { project: [] },
  travel: { baseline: [], project: [] },
  cold: { project: [] },
};
const live = (events, over, render, panel) =>
  page.evaluate(
    ([e, o, r, p]) => window.fleetBench.live(e, o, r, p),
    [events, over, render, panel],
  );
const travel = (render, settle = true, at = steps) =>
  page.evaluate(
    ([e, s, r, w]) => window.fleetBench.travel(e, s, r, w),
    [opt.session, at, render, settle],
  );
for (let round = 0; round < opt.rounds; round++) {
  out.live.baseline.push(await live(opt.events, opt.overMs, false, "execution"));
  out.live.project.push(await live(opt.events, opt.overMs, true, "execution"));
  out.burst.baseline.push(await live(opt.events, 0, false, "execution"));
  out.burst.project.push(await live(opt.events, 0, true, "execution"));
  out.tree.project.push(await live(opt.events, opt.overMs, true, "tree"));
  out.travel.baseline.push(await travel(false));
  out.travel.project.push(await travel(true));
  // the first jump to the last step right after the session loaded, before any checkpoint
  out.cold.project.push(await travel(true, false, [opt.session - 1]));
}
if (opt.profile) {
  // Where the main thread's time goes: the CPU profile's self time per function, for one live
  // turn and one round of time-travel steps.
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Profiler.enable");
  await cdp.send("Profiler.setSamplingInterval", { interval: 200 });
  const profiled = async (run) => {
    await cdp.send("Profiler.start");
    await run();
    const { profile } = await cdp.send("Profiler.stop");
    const self = new Map();
    const byId = new Map(profile.nodes.map((n) => [n.id, n]));
    profile.samples.forEach((id, i) => {
      const f = byId.get(id)?.callFrame;
      const name = f
        ? `${f.functionName || "(anonymous)"} ${f.url.split("/").pop()}:${f.lineNumber}`
        : "?";
      self.set(name, (self.get(name) ?? 0) + (profile.timeDeltas[i] ?? 0) / 1000);
    });
    const total = [...self.values()].reduce((a, b) => a + b, 0);
    return { total_ms: total, top: [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, 12) };
  };
  out.profile = {
    live: await profiled(() => live(opt.events, opt.overMs, true, "execution")),
    travel: await profiled(() => travel(true)),
  };
}
await browser.close();
out.errors = errors;
console.log(JSON.stringify(out));
