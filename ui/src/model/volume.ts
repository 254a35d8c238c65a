// The volume browser's rows from `GET /runtime/volume/tree` (`{volume, path, entries: [{name,
// kind, size}], truncated}`): paths joined under the listed directory, directories first.
import type { VolumeTree } from "../api/http";

export interface Entry {
  name: string;
  path: string;
  dir: boolean;
  size: number;
}

export function entries(tree: VolumeTree | undefined): Entry[] {
  if (!tree) return [];
  const base = tree.path.replace(/\/+$/, "");
  return tree.entries
    .map((e) => ({
      name: e.name,
      path: base ? `${base}/${e.name}` : e.name,
      dir: e.kind === "dir",
      size: e.size,
    }))
    .sort((a, b) => Number(b.dir) - Number(a.dir) || a.name.localeCompare(b.name));
}

export function parentOf(path: string): string {
  const parts = path.replace(/\/$/, "").split("/");
  parts.pop();
  return parts.join("/");
}
