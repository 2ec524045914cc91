// Which process to start as the language server.
//
// Order, first that applies wins:
//   1. `fuselens.server.path`: an explicit `fuselens` executable;
//   2. `fuselens.server.python`: an explicit interpreter with fuselens installed;
//   3. the interpreter selected in the Python extension (ms-python), if it has fuselens;
//   4. `fuselens` on PATH.
// Explicit settings come first because a user only sets them on purpose. The two path
// settings are "restrictedConfigurations" in package.json: in an untrusted workspace VS Code
// ignores their workspace values, so a cloned repository cannot choose the executable.
// For the same reason an interpreter picked by ms-python that lives inside an untrusted
// workspace folder is not used.

import { execFile } from "child_process";
import * as path from "path";
import * as vscode from "vscode";

export interface ServerCommand {
  command: string;
  args: string[];
  /** Where the choice came from, for the log. */
  source: string;
}

const SERVE_ARGS = ["serve", "--stdio"];
const MODULE_ARGS = ["-m", "fuselens.cli.main", ...SERVE_ARGS];

export type Log = (line: string) => void;

/** Does `python` have fuselens installed? Runs `python -c` with a short timeout. */
export function hasFuselens(python: string, cwd: string): Promise<boolean> {
  const probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('fuselens.server') is None)";
  return new Promise((resolve) => {
    execFile(python, ["-c", probe], { cwd, timeout: 15000 }, (error) => resolve(!error));
  });
}

/** The interpreter the Python extension has selected for `resource`, if it is installed. */
export async function selectedPython(resource: vscode.Uri | undefined): Promise<string | undefined> {
  const ext = vscode.extensions.getExtension("ms-python.python");
  if (!ext) {
    return undefined;
  }
  try {
    const api: any = ext.isActive ? ext.exports : await ext.activate();
    // The current API ("environments"), then the older one ("settings.getExecutionDetails").
    const envs = api?.environments;
    if (envs?.getActiveEnvironmentPath) {
      const active = envs.getActiveEnvironmentPath(resource);
      const resolved = await envs.resolveEnvironment(active);
      const exe: string | undefined = resolved?.executable?.uri?.fsPath ?? active?.path;
      if (exe) {
        return exe;
      }
    }
    const details = api?.settings?.getExecutionDetails?.(resource);
    return details?.execCommand?.[0];
  } catch {
    return undefined; // a Python extension that cannot answer is the same as none
  }
}

function insideWorkspace(file: string): boolean {
  const folders = vscode.workspace.workspaceFolders ?? [];
  return folders.some((f) => {
    const rel = path.relative(f.uri.fsPath, file);
    return rel === "" || (!rel.startsWith("..") && !path.isAbsolute(rel));
  });
}

/** Decide how to start the server; `cwd` is a neutral folder outside every workspace. */
export async function resolveServer(
  config: { get<T>(key: string): T | undefined },
  resource: vscode.Uri | undefined,
  cwd: string,
  log: Log,
): Promise<ServerCommand> {
  const explicitPath = config.get<string>("server.path");
  if (explicitPath) {
    return { command: explicitPath, args: SERVE_ARGS, source: "fuselens.server.path" };
  }
  const explicitPython = config.get<string>("server.python");
  if (explicitPython) {
    return { command: explicitPython, args: MODULE_ARGS, source: "fuselens.server.python" };
  }
  const selected = await selectedPython(resource);
  if (selected) {
    if (!vscode.workspace.isTrusted && insideWorkspace(selected)) {
      log(`not using ${selected}: it lies inside this untrusted workspace`);
    } else if (await hasFuselens(selected, cwd)) {
      return { command: selected, args: MODULE_ARGS, source: "the Python extension's selected interpreter" };
    } else {
      log(`the selected interpreter ${selected} has no fuselens installed ` +
        `(${selected} -m pip install fuselens); trying \`fuselens\` on PATH`);
    }
  }
  return { command: "fuselens", args: SERVE_ARGS, source: "PATH" };
}
