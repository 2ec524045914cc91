// Entry point: wires the language client, the palette commands, the status bar and
// Workspace Trust together. Each piece lives in its own module:
//   server.ts   which process to start        config.ts  settings sent to the server
//   client.ts   LanguageClient + middleware   commands.ts palette commands
//   status.ts   the status bar's state        results.ts  the validation results view

import * as vscode from "vscode";
import { DidChangeConfigurationNotification } from "vscode-languageclient/node";
import { Controller } from "./client";
import { PALETTE_COMMANDS, registerCommands } from "./commands";
import { RESTART_KEYS, serverSettings } from "./config";
import { ResultsPanel } from "./results";
import { StatusModel } from "./status";

let controller: Controller | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<Controller> {
  const output = vscode.window.createOutputChannel("fuselens");
  const item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 50);
  item.name = "fuselens";
  item.command = PALETTE_COMMANDS.showOutput;
  context.subscriptions.push(output, item);

  const status = new StatusModel(() => {
    const shown = status.shown(vscode.window.activeTextEditor?.document.uri.toString());
    item.text = shown.text;
    item.tooltip = shown.tooltip;
    item.backgroundColor = shown.error ? new vscode.ThemeColor("statusBarItem.errorBackground") : undefined;
  });
  status.refresh();
  item.show();

  const results = new ResultsPanel(context.extensionUri);
  context.subscriptions.push(results);
  controller = new Controller(context.globalStorageUri.fsPath, output, status, (result) => results.showValidation(result));
  const ctl = controller;
  registerCommands(context, ctl, status, output, results);

  context.subscriptions.push(
    vscode.window.onDidChangeActiveTextEditor(() => status.refresh()),
    // Trust is granted once per window; the server reads it at initialisation, so restart.
    vscode.workspace.onDidGrantWorkspaceTrust(() => ctl.restart("the workspace is now trusted")),
    // (Listeners return their promise only so that tests can wait for them.)
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (RESTART_KEYS.some((key) => e.affectsConfiguration(key))) {
        return ctl.restart("its settings changed");
      }
      if (e.affectsConfiguration("fuselens") && ctl.client?.isRunning()) {
        // The server re-reads its settings and re-analyzes the open documents.
        return ctl.client.sendNotification(DidChangeConfigurationNotification.type, {
          settings: { fuselens: serverSettings(vscode.workspace.getConfiguration("fuselens")) },
        });
      }
      return undefined;
    }),
    { dispose: () => void ctl.stop() },
  );
  watchPythonInterpreter(context, ctl);

  await ctl.start();
  return ctl;
}

/** Restart when the interpreter selected in the Python extension changes (if it is installed). */
function watchPythonInterpreter(context: vscode.ExtensionContext, ctl: Controller): void {
  const ext = vscode.extensions.getExtension("ms-python.python");
  if (!ext) {
    return;
  }
  void Promise.resolve(ext.isActive ? ext.exports : ext.activate()).then(
    (api: any) => {
      const event = api?.environments?.onDidChangeActiveEnvironmentPath;
      if (typeof event === "function") {
        context.subscriptions.push(event(() => void ctl.restart("the selected Python interpreter changed")));
      }
    },
    () => undefined,
  );
}

export async function deactivate(): Promise<void> {
  await controller?.stop();
  controller = undefined;
}
