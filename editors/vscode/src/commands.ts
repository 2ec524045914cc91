// Palette commands. They forward to the server's workspace commands (server/commands.py).
//
// The server's own command ids (fuselens.analyze, fuselens.validateAll, ...) are registered
// in VS Code by the language client itself, for the code lenses to run, so the palette
// commands use ids of their own (fuselens.palette.*) and add what the palette needs:
// picking the document, and the cluster at the cursor.

import * as vscode from "vscode";
import { ExecuteCommandRequest } from "vscode-languageclient/node";
import { Controller } from "./client";
import { ResultsPanel, resultsViewOf } from "./results";
import { StatusModel } from "./status";

export const PALETTE_COMMANDS = {
  analyze: "fuselens.palette.analyze",
  validateKernel: "fuselens.palette.validateKernel",
  validateAll: "fuselens.palette.validateAll",
  showKernel: "fuselens.palette.showKernel",
  showResults: "fuselens.palette.showResults",
  restart: "fuselens.palette.restart",
  showOutput: "fuselens.palette.showOutput",
} as const;

function activePythonUri(): vscode.Uri | undefined {
  const doc = vscode.window.activeTextEditor?.document;
  if (!doc || doc.languageId !== "python" || doc.uri.scheme !== "file") {
    void vscode.window.showWarningMessage("fuselens: open a Python file first.");
    return undefined;
  }
  return doc.uri;
}

/** The cluster ids in `uri`'s diagnostics (the server puts `{cluster: id}` in their data). */
export function clusterDiagnostics(uri: vscode.Uri): { id: string; diagnostic: vscode.Diagnostic }[] {
  return vscode.languages
    .getDiagnostics(uri)
    .filter((d) => d.source === "fuselens")
    .map((d) => ({ id: (d as { data?: { cluster?: string } }).data?.cluster, diagnostic: d }))
    .filter((c): c is { id: string; diagnostic: vscode.Diagnostic } => typeof c.id === "string");
}

/**
 * The cluster "Validate kernel at cursor…" validates: the one whose diagnostic holds the cursor; where
 * several do (clusters on the same lines), or none, the user picks, from those at the cursor or else
 * from all of the file's. Never every kernel: that is "Validate all".
 */
async function pickCluster(uri: vscode.Uri): Promise<string | undefined> {
  const clusters = clusterDiagnostics(uri);
  if (clusters.length === 0) {
    void vscode.window.showInformationMessage("fuselens: no fusable clusters in this file (yet).");
    return undefined;
  }
  const cursor = vscode.window.activeTextEditor?.selection.active;
  const here = cursor ? clusters.filter((c) => c.diagnostic.range.contains(cursor)) : [];
  if (here.length === 1) {
    return here[0].id;
  }
  const choice = await vscode.window.showQuickPick(
    (here.length ? here : clusters).map((c) => ({
      label: c.id,
      description: `line ${c.diagnostic.range.start.line + 1}`,
      detail: c.diagnostic.message,
    })),
    {
      placeHolder: here.length
        ? "Clusters at the cursor: validate the kernel of which?"
        : "No cluster at the cursor: validate the kernel of which?",
    },
  );
  return choice?.label;
}

/** An answer of the server's for a folder it runs nothing in (server/commands.py). */
function untrustedAnswer(result: unknown): boolean {
  const answer = result as { reason?: unknown; error?: unknown } | undefined;
  return answer?.reason === "untrusted" || answer?.error === "untrusted";
}

/**
 * For a command that runs the model's code (analyze, validate, the kernel of an analysis) in a
 * workspace that is not trusted: opens Workspace Trust, where the user can grant it, and says true.
 * No notification of the extension's own: the server has already told the user why, once, in VS
 * Code's words (window/showMessage, server/state.py `Folders.untrusted`), and a second one would stack on it.
 */
function openTrustInstead(result?: unknown): boolean {
  if (vscode.workspace.isTrusted && !untrustedAnswer(result)) {
    return false;
  }
  void vscode.commands.executeCommand("workbench.trust.manage");
  return true;
}

/** The server's command that answers with the results view of a file's last validation. */
export const VALIDATION_RESULTS = "fuselens.validationResults";

export function registerCommands(
  context: vscode.ExtensionContext,
  controller: Controller,
  status: StatusModel,
  output: vscode.OutputChannel,
  results: ResultsPanel,
): void {
  const run = async (command: string, args: unknown[]): Promise<unknown> => {
    const client = controller.client;
    if (!client || !client.isRunning()) {
      void vscode.window.showErrorMessage("fuselens: the language server is not running (fuselens: Restart server).");
      return undefined;
    }
    try {
      const uri = typeof args[0] === "string" ? args[0] : undefined;
      return await status.track(uri, command, client.sendRequest(ExecuteCommandRequest.type, { command, arguments: args }));
    } catch (error) {
      // The server answers bad requests ("no analysis of ... yet") with a message for people.
      void vscode.window.showWarningMessage(`fuselens: ${error instanceof Error ? error.message : error}`);
      return undefined;
    }
  };

  const register = (id: string, handler: () => unknown) =>
    context.subscriptions.push(vscode.commands.registerCommand(id, handler));

  register(PALETTE_COMMANDS.analyze, async () => {
    const uri = activePythonUri();
    if (!uri || openTrustInstead()) {
      return;
    }
    const result = (await run("fuselens.analyze", [uri.toString()])) as { scheduled?: boolean } | undefined;
    if (result?.scheduled) {
      status.analyzing(uri.toString());
    } else {
      openTrustInstead(result);
    }
  });
  const validate = async (command: string, args: unknown[]) => {
    const result = await run(command, args);
    if (!openTrustInstead(result)) {
      results.showValidation(result);
    }
  };
  register(PALETTE_COMMANDS.validateKernel, async () => {
    const uri = activePythonUri();
    if (!uri || openTrustInstead()) {
      return; // (an untrusted file has no clusters to pick from: it was never analyzed)
    }
    const cluster = await pickCluster(uri);
    if (cluster) {
      await validate("fuselens.validateKernel", [uri.toString(), cluster]);
    }
  });
  register(PALETTE_COMMANDS.validateAll, async () => {
    const uri = activePythonUri();
    if (uri && !openTrustInstead()) {
      await validate("fuselens.validateAll", [uri.toString()]);
    }
  });
  register(PALETTE_COMMANDS.showResults, async () => {
    const uri = activePythonUri();
    const result = uri && (await run(VALIDATION_RESULTS, [uri.toString()]));
    const view = resultsViewOf(result);
    if (view) {
      results.show(view, false);
    } else if (result) {
      const why = (result as { message?: string }).message ?? "no validation results";
      void vscode.window.showInformationMessage(`fuselens: ${why} (fuselens: Validate all).`);
    }
  });
  register(PALETTE_COMMANDS.showKernel, async () => {
    const uri = activePythonUri();
    if (uri && !openTrustInstead()) { // (no analysis, no kernel)
      await run("fuselens.showKernel", [uri.toString()]); // the server opens the file (showDocument)
    }
  });
  register(PALETTE_COMMANDS.restart, () => controller.restart("asked from the command palette"));
  register(PALETTE_COMMANDS.showOutput, () => output.show());
}
