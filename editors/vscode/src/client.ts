// The language client: starting, stopping and restarting `fuselens serve --stdio`, and the
// middleware that feeds the status bar and filters the settings the server is sent.

import * as fs from "fs";
import * as path from "path";
import * as vscode from "vscode";
import {
  LanguageClient,
  LanguageClientOptions,
  MessageActionItem,
  MessageType,
  ServerOptions,
  ShowMessageRequest,
  ShowMessageRequestParams,
  State,
} from "vscode-languageclient/node";
import { serverSettings } from "./config";
import { resolveServer, ServerCommand } from "./server";
import { StatusModel } from "./status";

export const CLIENT_ID = "fuselens";

/** What the server is told at initialisation; trust comes from VS Code, never from a file. */
export function initializationOptions(): { workspaceTrusted: boolean; settings: Record<string, unknown> } {
  return {
    workspaceTrusted: vscode.workspace.isTrusted,
    settings: serverSettings(vscode.workspace.getConfiguration("fuselens")),
  };
}

function isPythonFile(doc: vscode.TextDocument): boolean {
  return doc.uri.scheme === "file" && doc.languageId === "python";
}

/** A file no one may write: the server's kernel views are (generated code to read), and it
 * analyzes none of them, so marking one "analyzing" would spin forever. Mode bits, not access():
 * root may write any file. */
function isReadOnly(doc: vscode.TextDocument): boolean {
  try {
    return (fs.statSync(doc.uri.fsPath).mode & 0o222) === 0;
  } catch {
    return false;
  }
}

/** A file of the workspace's folders, not of an installed package: the only files the server analyzes
 * (trust is per folder, not per window), so a library's source opened from a diagnostic's link is
 * never marked "analyzing". Resolved paths, as the server decides. */
function inWorkspace(doc: vscode.TextDocument): boolean {
  const real = (p: string) => {
    try {
      return fs.realpathSync(p);
    } catch {
      return p;
    }
  };
  const file = real(doc.uri.fsPath);
  const folder = (vscode.workspace.workspaceFolders ?? [])
    .map((f) => real(f.uri.fsPath))
    .find((f) => file.startsWith(f + path.sep));
  const installed = (part: string) => part === "site-packages" || part === "dist-packages";
  return folder !== undefined && !path.relative(folder, file).split(path.sep).some(installed);
}

export function clientOptions(
  output: vscode.OutputChannel,
  status: StatusModel,
  onCommandResult: (result: unknown) => void = () => undefined,
): LanguageClientOptions {
  // The server analyzes only trusted files and says nothing for the others, so an untrusted
  // document, or one outside the workspace's folders, is never marked "analyzing" (it would spin
  // forever).
  const sent = (doc: vscode.TextDocument) => {
    if (isPythonFile(doc) && vscode.workspace.isTrusted && inWorkspace(doc) && !isReadOnly(doc)) {
      status.analyzing(doc.uri.toString());
    }
  };
  return {
    documentSelector: [{ scheme: "file", language: "python" }],
    outputChannel: output,
    // The hover's "Open the kernel" link runs the server's command; no other command link is trusted.
    markdown: { isTrusted: { enabledCommands: ["fuselens.showKernel"] }, supportHtml: false },
    initializationOptions,
    middleware: {
      // A server command run from a code lens ("Validate all"): its result goes to the results view.
      executeCommand: async (command, args, next) => {
        const uri = typeof args[0] === "string" ? args[0] : undefined;
        const result = await status.track(uri, command, Promise.resolve(next(command, args)));
        onCommandResult(result);
        return result;
      },
      didOpen: (doc, next) => {
        sent(doc);
        return next(doc);
      },
      didSave: (doc, next) => {
        sent(doc);
        return next(doc);
      },
      didClose: (doc, next) => {
        status.closed(doc.uri.toString());
        return next(doc);
      },
      handleDiagnostics: (uri, diagnostics, next) => {
        status.diagnostics(uri.toString(), diagnostics);
        next(uri, diagnostics);
      },
      // Progress shows once: in the status item, on the document it is for, with its percentage. The
      // client's own display (a second status bar entry, without the percentage) is never begun; it
      // hears of the end only, to let go of the token.
      handleWorkDoneProgress: (token, params, next) => {
        const key = String(token);
        if (params.kind === "begin") {
          status.progressBegin(key, params.title, params.percentage);
        } else if (params.kind === "report") {
          status.progressReport(key, params.message, params.percentage);
        } else {
          status.progressEnd(key);
          next(token, params);
        }
      },
      workspace: {
        // The server asks for section "fuselens"; answer with its keys only (see config.ts).
        configuration: (params, token, next) => {
          if (params.items.every((item) => item.section === "fuselens")) {
            return params.items.map((item) => {
              const scope = item.scopeUri ? vscode.Uri.parse(item.scopeUri) : undefined;
              return serverSettings(vscode.workspace.getConfiguration("fuselens", scope));
            });
          }
          return next(params, token);
        },
      },
    },
  };
}

/**
 * The server's questions (window/showMessageRequest: "No CUDA GPU here: check numerics in the
 * interpreter?") as modal dialogs. The client's own shows a notification, which hides itself after
 * a while and leaves the validation waiting on an answer nobody can see; a dialog stays until it is
 * answered or dismissed (no answer, as Escape gives, is "no").
 */
export async function askUntilAnswered(params: ShowMessageRequestParams): Promise<MessageActionItem | null> {
  const ask =
    params.type === MessageType.Error
      ? vscode.window.showErrorMessage
      : params.type === MessageType.Warning
        ? vscode.window.showWarningMessage
        : vscode.window.showInformationMessage;
  const answer = await ask<MessageActionItem>(params.message, { modal: true }, ...(params.actions ?? []));
  return answer ?? null;
}

/** Owns the one LanguageClient; `restart` builds a new one (the interpreter may have changed). */
export class Controller {
  client: LanguageClient | undefined;
  server: ServerCommand | undefined;
  private stopping = false;

  constructor(
    private readonly storage: string,
    private readonly output: vscode.OutputChannel,
    private readonly status: StatusModel,
    private readonly onCommandResult: (result: unknown) => void = () => undefined,
  ) {}

  log(line: string): void {
    this.output.appendLine(`[extension] ${line}`);
  }

  async start(): Promise<void> {
    // Run the server from a folder of the extension's own: `python -m` puts the working
    // directory first on sys.path, and a workspace must not supply the code that runs.
    fs.mkdirSync(this.storage, { recursive: true });
    const config = vscode.workspace.getConfiguration("fuselens");
    const active = vscode.window.activeTextEditor?.document.uri;
    const server = await resolveServer(config, active, this.storage, (l) => this.log(l));
    this.server = server;
    this.log(`starting ${server.command} ${server.args.join(" ")} (from ${server.source}); ` +
      `workspace ${vscode.workspace.isTrusted ? "trusted" : "not trusted: analysis waits for trust"}`);
    const serverOptions: ServerOptions = { command: server.command, args: server.args, options: { cwd: this.storage } };
    const options = clientOptions(this.output, this.status, this.onCommandResult);
    const client = new LanguageClient(CLIENT_ID, "fuselens", serverOptions, options);
    client.onDidChangeState((e) => {
      if (e.newState === State.Stopped && !this.stopping) {
        this.status.setServerError("the language server stopped; see the fuselens output");
      }
    });
    this.client = client;
    this.status.setServerError(undefined);
    try {
      await client.start();
      client.onRequest(ShowMessageRequest.type, askUntilAnswered);
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      this.status.setServerError(`the server did not start: ${why}`);
      this.log(`could not start ${server.command}: ${why}`);
      void vscode.window
        .showErrorMessage(
          `fuselens: could not start the language server (${server.command}). Install fuselens into your ` +
            "Python environment (pip install fuselens) or set fuselens.server.path.",
          "Open Settings",
          "Show Log",
        )
        .then((choice) => {
          if (choice === "Open Settings") {
            void vscode.commands.executeCommand("workbench.action.openSettings", "fuselens.server");
          } else if (choice === "Show Log") {
            this.output.show();
          }
        });
    }
  }

  async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (!client) {
      return;
    }
    this.stopping = true;
    try {
      if (client.isRunning()) {
        await client.stop();
      }
    } catch (error) {
      this.log(`stopping the server: ${error}`);
    } finally {
      this.stopping = false;
    }
  }

  async restart(why: string): Promise<void> {
    this.log(`restarting the server: ${why}`);
    await this.stop();
    await this.start();
  }
}
