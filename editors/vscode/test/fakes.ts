// Stand-ins for the `vscode` module and for `vscode-languageclient/node`, so the extension's
// activation runs under plain Node (mocha) with no VS Code binary. They record what the
// extension does with them; the tests assert on the records.
//
// Only the API the extension uses is here. The protocol types (ExecuteCommandRequest, ...)
// are the real ones from vscode-languageserver-protocol, which does not need VS Code.

import * as path from "path";
import * as protocol from "vscode-languageserver-protocol";

type Listener<T> = (value: T) => unknown;

export class Emitter<T> {
  listeners: Listener<T>[] = [];
  event = (listener: Listener<T>) => {
    this.listeners.push(listener);
    return { dispose: () => (this.listeners = this.listeners.filter((l) => l !== listener)) };
  };
  async fire(value: T): Promise<void> {
    for (const l of this.listeners) {
      await l(value);
    }
  }
}

export class FakeUri {
  constructor(readonly scheme: string, readonly fsPath: string) {}
  static file(p: string): FakeUri {
    return new FakeUri("file", path.resolve(p));
  }
  static parse(s: string): FakeUri {
    return s.startsWith("file://") ? new FakeUri("file", decodeURIComponent(s.slice(7))) : new FakeUri("other", s);
  }
  static joinPath(base: FakeUri, ...parts: string[]): FakeUri {
    return new FakeUri(base.scheme, path.join(base.fsPath, ...parts));
  }
  toString(): string {
    return `file://${this.fsPath}`;
  }
}

/** The scheme the fake webview serves the extension's files under (`asWebviewUri`). */
export const WEBVIEW_SCHEME = "https://fake.vscode-resource";

/** A webview panel the extension created, as far as the extension uses one. */
export class FakeWebviewPanel {
  title: string;
  visible = true;
  disposed = false;
  reveals: { viewColumn: unknown; preserveFocus?: boolean }[] = [];
  private disposeListeners: (() => unknown)[] = [];
  readonly webview = {
    html: "",
    cspSource: WEBVIEW_SCHEME,
    asWebviewUri: (uri: FakeUri) => ({ toString: () => `${WEBVIEW_SCHEME}${uri.fsPath}` }),
  };
  constructor(
    readonly viewType: string,
    title: string,
    readonly showOptions: unknown,
    readonly options: { enableScripts?: boolean; localResourceRoots?: FakeUri[] },
  ) {
    this.title = title;
  }
  reveal(viewColumn?: unknown, preserveFocus?: boolean) {
    this.reveals.push({ viewColumn, preserveFocus });
  }
  onDidDispose(listener: () => unknown) {
    this.disposeListeners.push(listener);
    return { dispose: () => undefined };
  }
  dispose() {
    this.disposed = true;
    this.disposeListeners.forEach((l) => l());
  }
}

/** A position and a range, as far as the extension reads them. */
export class FakePosition {
  constructor(readonly line: number, readonly character: number) {}
}

export class FakeRange {
  constructor(readonly start: FakePosition, readonly end: FakePosition) {}
  contains(p: FakePosition): boolean {
    const after = (a: FakePosition, b: FakePosition) => a.line > b.line || (a.line === b.line && a.character >= b.character);
    return after(p, this.start) && after(this.end, p);
  }
}

/** A diagnostic of the server's, as VS Code hands it back (the language client keeps its `data`). */
export function clusterDiagnostic(id: string, firstLine: number, lastLine: number) {
  const range = new FakeRange(new FakePosition(firstLine - 1, 0), new FakePosition(lastLine - 1, 80));
  return { source: "fuselens", message: `fusable: ${id}`, range, data: { cluster: id } };
}

/** A message the extension showed: its level, text, options ({ modal }) and the actions offered. */
export interface ShownMessage {
  level: string;
  text: string;
  options?: { modal?: boolean };
  actions?: unknown[];
}

function message(state: FakeState, level: string, text: string, rest: unknown[]) {
  const first = rest[0] as { modal?: boolean } | undefined;
  const options = typeof first === "object" && first !== null && "modal" in first ? first : undefined;
  const actions = options ? rest.slice(1) : rest;
  state.messages.push({ level, text, ...(options ? { options } : {}), ...(actions.length ? { actions } : {}) });
  return state.answer(text, actions);
}

export interface FakeState {
  settings: Record<string, unknown>; // "fuselens.x" -> value
  trusted: boolean;
  commands: Map<string, (...args: unknown[]) => unknown>;
  executed: unknown[][];
  statusItems: any[];
  outputs: { name: string; lines: string[] }[];
  messages: ShownMessage[];
  answer: (text: string, actions: unknown[]) => unknown; // what the user picks in a message (default: nothing)
  quickPicks: { labels: string[]; placeHolder?: string }[];
  diagnostics: Map<string, unknown[]>; // uri -> what vscode.languages.getDiagnostics gives
  panels: FakeWebviewPanel[];
  workspaceFolders: { uri: FakeUri }[];
  pythonExtension?: { exports: unknown };
  activeEditor?: { document: { uri: FakeUri; languageId: string }; selection?: { active: FakePosition } };
  grantTrust: Emitter<void>;
  activeEditorChange: Emitter<unknown>; // fired (by a test) after it sets `activeEditor`
  configChange: Emitter<{ affectsConfiguration(key: string): boolean }>;
}

export function makeVscode(state: FakeState) {
  const configuration = (section: string) => ({
    get<T>(key: string): T | undefined {
      const full = `${section}.${key}`;
      if (full in state.settings) {
        return state.settings[full] as T;
      }
      // Nested objects, as VS Code returns them: "fuselens.worker" from "fuselens.worker.python".
      const prefix = `${full}.`;
      const nested = Object.entries(state.settings).filter(([k]) => k.startsWith(prefix));
      return nested.length ? (Object.fromEntries(nested.map(([k, v]) => [k.slice(prefix.length), v])) as T) : undefined;
    },
  });
  return {
    Uri: FakeUri,
    Position: FakePosition,
    Range: FakeRange,
    ThemeColor: class {
      constructor(readonly id: string) {}
    },
    StatusBarAlignment: { Left: 1, Right: 2 },
    ViewColumn: { Active: -1, Beside: -2, One: 1, Two: 2 },
    ProgressLocation: { Notification: 15, Window: 10 },
    window: {
      get activeTextEditor() {
        return state.activeEditor;
      },
      createOutputChannel(name: string) {
        const channel = { name, lines: [] as string[] };
        state.outputs.push(channel);
        return {
          name,
          appendLine: (l: string) => channel.lines.push(l),
          append: (l: string) => channel.lines.push(l),
          show: () => undefined,
          dispose: () => undefined,
        };
      },
      createStatusBarItem(alignment: number, priority: number) {
        const item: any = { alignment, priority, visible: false, dispose: () => undefined };
        item.show = () => (item.visible = true);
        item.hide = () => (item.visible = false);
        state.statusItems.push(item);
        return item;
      },
      createWebviewPanel(viewType: string, title: string, showOptions: unknown, options: any) {
        const panel = new FakeWebviewPanel(viewType, title, showOptions, options ?? {});
        state.panels.push(panel);
        return panel;
      },
      onDidChangeActiveTextEditor: state.activeEditorChange.event,
      showErrorMessage: async (text: string, ...rest: unknown[]) => message(state, "error", text, rest),
      showWarningMessage: async (text: string, ...rest: unknown[]) => message(state, "warning", text, rest),
      showInformationMessage: async (text: string, ...rest: unknown[]) => message(state, "info", text, rest),
      showQuickPick: async (items: { label: string }[], options?: { placeHolder?: string }) => {
        state.quickPicks.push({ labels: items.map((i) => i.label), placeHolder: options?.placeHolder });
        return items[0];
      },
    },
    workspace: {
      get isTrusted() {
        return state.trusted;
      },
      get workspaceFolders() {
        return state.workspaceFolders;
      },
      getConfiguration: configuration,
      onDidGrantWorkspaceTrust: state.grantTrust.event,
      onDidChangeConfiguration: state.configChange.event,
    },
    commands: {
      registerCommand(id: string, handler: (...args: unknown[]) => unknown) {
        if (state.commands.has(id)) {
          throw new Error(`command '${id}' already exists`);
        }
        state.commands.set(id, handler);
        return { dispose: () => state.commands.delete(id) };
      },
      executeCommand: async (...args: unknown[]) => void state.executed.push(args),
    },
    languages: { getDiagnostics: (uri: FakeUri) => state.diagnostics.get(uri.toString()) ?? [] },
    extensions: {
      getExtension: (id: string) =>
        id === "ms-python.python" && state.pythonExtension
          ? { isActive: true, exports: state.pythonExtension.exports, activate: async () => state.pythonExtension!.exports }
          : undefined,
    },
  };
}

/** Every LanguageClient the extension constructed, in order. */
export const clients: FakeLanguageClient[] = [];

export class FakeLanguageClient {
  running = false;
  started = 0;
  stopped = 0;
  requests: { type: string; params: unknown }[] = [];
  notifications: { type: string; params: unknown }[] = [];
  stateListeners: Listener<{ oldState: number; newState: number }>[] = [];
  constructor(
    readonly id: string,
    readonly name: string,
    readonly serverOptions: any,
    readonly clientOptions: any,
  ) {
    clients.push(this);
  }
  onDidChangeState(listener: Listener<{ oldState: number; newState: number }>) {
    this.stateListeners.push(listener);
    return { dispose: () => undefined };
  }
  async start() {
    this.started++;
    this.running = true;
  }
  async stop() {
    this.stopped++;
    this.running = false;
  }
  isRunning() {
    return this.running;
  }
  /** The handlers the extension set for the server's requests, by method. */
  requestHandlers = new Map<string, (params: any) => unknown>();
  onRequest(type: { method: string }, handler: (params: any) => unknown) {
    this.requestHandlers.set(type.method, handler);
    return { dispose: () => this.requestHandlers.delete(type.method) };
  }
  /** What the "server" answers (a test may swap it: a canned answer, or a real server's). */
  answer: (method: string, params: unknown) => unknown = () => ({ scheduled: true });
  async sendRequest(type: { method: string }, params: unknown) {
    this.requests.push({ type: type.method, params });
    return this.answer(type.method, params);
  }
  async sendNotification(type: { method: string }, params: unknown) {
    this.notifications.push({ type: type.method, params });
  }
}

export const fakeLanguageClientModule = {
  ...protocol,
  LanguageClient: FakeLanguageClient,
  State: { Stopped: 1, Running: 2, Starting: 3 },
};

export function freshState(): FakeState {
  return {
    settings: {},
    trusted: true,
    commands: new Map(),
    executed: [],
    statusItems: [],
    outputs: [],
    messages: [],
    answer: () => undefined,
    quickPicks: [],
    diagnostics: new Map(),
    panels: [],
    workspaceFolders: [],
    grantTrust: new Emitter<void>(),
    activeEditorChange: new Emitter<unknown>(),
    configChange: new Emitter(),
  };
}

/**
 * Load the compiled extension with the fakes in place of `vscode` and the language client.
 * Each call loads fresh copies of the extension's modules, bound to `state`.
 */
export function loadExtension(state: FakeState) {
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const Module = require("module");
  const vscode = makeVscode(state);
  const original = Module._load;
  Module._load = function (request: string, ...rest: unknown[]) {
    if (request === "vscode") {
      return vscode;
    }
    if (request === "vscode-languageclient/node") {
      return fakeLanguageClientModule;
    }
    return original.call(this, request, ...rest);
  };
  const srcDir = path.resolve(__dirname, "..", "src");
  for (const key of Object.keys(require.cache)) {
    if (key.startsWith(srcDir)) {
      delete require.cache[key];
    }
  }
  try {
    return {
      extension: require(path.join(srcDir, "extension")),
      client: require(path.join(srcDir, "client")),
      vscode,
    };
  } finally {
    Module._load = original;
  }
}

/** The extension's folder (what VS Code gives as `context.extensionUri`). */
export const EXTENSION_ROOT = path.resolve(__dirname, "..", "..");

/** A fake ExtensionContext. */
export function fakeContext(storage: string) {
  return {
    subscriptions: [] as { dispose(): unknown }[],
    globalStorageUri: FakeUri.file(storage),
    extensionUri: FakeUri.file(EXTENSION_ROOT),
  };
}
