// The `fuselens.*` settings, translated into what the server reads.
//
// The server takes the same keys in `initializationOptions.settings`, in
// `workspace/configuration` (section "fuselens") and in `workspace/didChangeConfiguration`
// (server/settings.py). It reports every key it does not know, and it rejects some
// "unset" values (an empty `remoteRunner` is not a command line). So the extension sends
// only the server's own keys, and only those that have a value; the extension's own keys
// (`fuselens.server.*`) never reach it.

/** The part of vscode.WorkspaceConfiguration these functions need (easy to fake in tests). */
export interface ConfigLike {
  get<T>(section: string): T | undefined;
}

/** Keys the server understands, as VS Code spells them. */
export const SERVER_KEYS = [
  "device",
  "peakGbps",
  "severity",
  "show",
  "inlayHints",
  "codeLens",
  "models",
  "worker",
  "remoteRunner",
  "remoteProfiler",
] as const;

/** Settings that decide which process is started: changing them restarts the server. */
export const RESTART_KEYS = ["fuselens.server.path", "fuselens.server.python", "fuselens.worker"];

function hasValue(value: unknown): boolean {
  if (value === undefined || value === null || value === "") {
    return false;
  }
  if (typeof value === "object" && !Array.isArray(value)) {
    return Object.keys(value as object).length > 0;
  }
  return true;
}

/** The settings object for the server, from the `fuselens` configuration section. */
export function serverSettings(config: ConfigLike): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key of SERVER_KEYS) {
    let value = config.get<unknown>(key);
    if (key === "worker" && value && typeof value === "object") {
      // Drop empty members too: `"python": ""` means "the server's interpreter".
      value = Object.fromEntries(Object.entries(value as object).filter(([, v]) => hasValue(v)));
    }
    if (hasValue(value)) {
      out[key] = value;
    }
  }
  return out;
}
