// The volume browser's listing, read tolerantly: the gateway's `runtime/volume/tree` answers
// `{entries: [...]}` or `{items: [...]}` or a bare list, an entry naming itself a directory
// by `kind`/`type` `"dir"|"directory"` or `is_dir`.
export interface Entry {
  name: string;
  path: string;
  dir: boolean;
  size: number | null;
}

function isDir(row: Record<string, unknown>): boolean {
  const kind = String(row.kind ?? row.type ?? "");
  return row.is_dir === true || kind === "dir" || kind === "directory";
}

export function entries(answer: unknown, base: string): Entry[] {
  const rows = Array.isArray(answer)
    ? answer
    : answer && typeof answer === "object"
      ? ((answer as Record<string, unknown>).entries ??
        (answer as Record<string, unknown>).items ??
        (answer as Record<string, unknown>).children ??
        [])
      : [];
  if (!Array.isArray(rows)) return [];
  return rows
    .filter((r): r is Record<string, unknown> => Boolean(r) && typeof r === "object")
    .map((r) => {
      const name = String(
        r.name ??
          String(r.path ?? "")
            .split("/")
            .pop() ??
          "",
      );
      const path = String(r.path ?? (base ? `${base.replace(/\/$/, "")}/${name}` : name));
      return { name, path, dir: isDir(r), size: typeof r.size === "number" ? r.size : null };
    })
    .sort((a, b) => Number(b.dir) - Number(a.dir) || a.name.localeCompare(b.name));
}

export function parentOf(path: string): string {
  const parts = path.replace(/\/$/, "").split("/");
  parts.pop();
  return parts.join("/");
}
