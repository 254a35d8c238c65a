// Shiki with its bundled Python grammar and one theme, on the JavaScript regex engine: no
// WebAssembly and nothing fetched at build or run time. Loaded on first use (its own chunk),
// and every highlighted cell is kept so a re-render or a time-travel step costs a map lookup.
import { createHighlighterCoreSync } from "shiki/core";
import { createJavaScriptRegexEngine } from "shiki/engine/javascript";
import python from "shiki/langs/python.mjs";
import theme from "shiki/themes/github-dark-high-contrast.mjs";

const highlighter = createHighlighterCoreSync({
  themes: [theme],
  langs: [python],
  engine: createJavaScriptRegexEngine(),
});
const cache = new Map<string, string>();
const MAX_CACHED = 5000;

/** The HTML already made for `code`, if any (costs a map lookup). */
export function peekPython(code: string): string | undefined {
  return cache.get(code);
}

/** HTML for `code` (Shiki escapes the source; nothing of it is interpreted as markup). */
export function highlightPython(code: string): string {
  const hit = cache.get(code);
  if (hit !== undefined) return hit;
  const html = highlighter.codeToHtml(code, { lang: "python", theme: "github-dark-high-contrast" });
  if (cache.size >= MAX_CACHED) cache.clear();
  cache.set(code, html);
  return html;
}
