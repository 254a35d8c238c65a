// A code cell's source: plain text at once, Shiki's colours as soon as its chunk has loaded.
import { useEffect, useState } from "react";

type Highlight = (code: string) => string;
let loaded: Highlight | null = null;
let loading: Promise<Highlight> | null = null;

function load(): Promise<Highlight> {
  loading ??= import("./highlight").then((m) => {
    loaded = m.highlightPython;
    return loaded;
  });
  return loading;
}

export function Code({ code }: { code: string }) {
  const [html, setHtml] = useState<string | null>(() => (loaded ? loaded(code) : null));
  useEffect(() => {
    if (loaded) {
      setHtml(loaded(code));
      return;
    }
    let live = true;
    load().then(
      (h) => live && setHtml(h(code)),
      () => {}, // plain text stays: highlighting is a nicety, never a failure
    );
    return () => {
      live = false;
    };
  }, [code]);
  if (html == null)
    return <pre className="max-h-48 overflow-auto p-2 text-sm text-emerald-200">{code}</pre>;
  return (
    <div
      className="shiki-cell max-h-48 overflow-auto text-sm [&_pre]:p-2"
      data-highlighted="python"
      // biome-ignore lint/security/noDangerouslySetInnerHtml: Shiki's output escapes the source
      dangerouslySetInnerHTML={{ __html: html }}
    />
  );
}
