// The status bar item: idle / analyzing / N clusters / validating / profiling / error.
//
// `StatusModel` is plain state with no VS Code in it, so the tests drive it directly. It
// is fed by the client's middleware (client.ts) and the palette commands (commands.ts): a
// document sent to the server (open, save, "Analyze") is "analyzing" until its diagnostics
// come back; the diagnostics say how many clusters it has or that the analysis failed; a
// validation or a profile run for a document shows on that document while it runs, with the
// server's work-done progress (its title and percentage) once it reports some. The item
// shows the state of the active editor's document, and is the only place progress shows.

export type Shown = { text: string; tooltip: string; error: boolean };

/** Diagnostic codes the server uses when an analysis did not produce a report. */
const FAILURE_CODES = new Set(["timeout", "memory", "crash", "internal", "unavailable"]);

/** Codes of the problems in the file itself that stop its analysis, and how the status names them. */
const PROBLEM_WORDS: Record<string, string> = {
  syntax: "syntax error",
  import: "import error",
  construct: "model not built",
  inputs: "no inputs",
  trace: "forward failed",
};

/** The fields of a (protocol) diagnostic the model reads. */
export interface DiagnosticLike {
  source?: string;
  code?: string | number | { value: string | number };
  message: string;
  data?: unknown;
}

interface DocState {
  analyzing: boolean;
  clusters: number;
  failure?: string;
  problem?: { words: string; message: string };
}

interface Progress {
  title: string;
  message?: string;
  percentage?: number;
}

/** A server command that runs for a while on one document (a validation, a profile). */
interface Running {
  uri: string;
  doing: string; // "validating", "profiling"
  progress?: string; // the token of the work-done progress it reports through, once it began
}

/** What the status says a long command is doing, by the server's command id. */
const DOING: Record<string, string> = {
  "fuselens.validateAll": "validating",
  "fuselens.validateKernel": "validating",
  "fuselens.profile": "profiling",
  "fuselens.probe": "probing",
};

function codeOf(d: DiagnosticLike): string {
  const code = d.code;
  return String(typeof code === "object" && code !== null ? code.value : code ?? "");
}

export class StatusModel {
  private docs = new Map<string, DocState>();
  private progress = new Map<string, Progress>();
  private running: Running[] = [];
  private serverError: string | undefined;
  private onChange: () => void;

  constructor(onChange: () => void = () => undefined) {
    this.onChange = onChange;
  }

  private doc(uri: string): DocState {
    let state = this.docs.get(uri);
    if (!state) {
      state = { analyzing: false, clusters: 0 };
      this.docs.set(uri, state);
    }
    return state;
  }

  /** A document was sent for analysis (opened, saved, or "Analyze" ran). */
  analyzing(uri: string): void {
    this.doc(uri).analyzing = true;
    this.onChange();
  }

  /** The server published diagnostics for `uri`. */
  diagnostics(uri: string, diagnostics: readonly DiagnosticLike[]): void {
    const ours = diagnostics.filter((d) => d.source === "fuselens");
    const state = this.doc(uri);
    state.analyzing = false;
    state.clusters = ours.filter((d) => (d.data as { cluster?: string } | undefined)?.cluster).length;
    state.failure = ours.find((d) => FAILURE_CODES.has(codeOf(d)))?.message;
    const problem = ours.find((d) => codeOf(d) in PROBLEM_WORDS);
    state.problem = problem ? { words: PROBLEM_WORDS[codeOf(problem)], message: problem.message } : undefined;
    this.onChange();
  }

  /** Show again (the active editor changed). */
  refresh(): void {
    this.onChange();
  }

  closed(uri: string): void {
    this.docs.delete(uri);
    this.onChange();
  }

  /**
   * Show `work` (the server's command `command` for the document `uri`) on that document while it
   * runs; its result, unchanged. Commands that end at once (analyze, show kernels) show nothing.
   */
  async track<T>(uri: string | undefined, command: string, work: Thenable<T>): Promise<T> {
    const doing = DOING[command];
    if (!uri || !doing) {
      return work;
    }
    const run: Running = { uri, doing };
    this.running.push(run);
    this.onChange();
    try {
      return await work;
    } finally {
      this.running = this.running.filter((r) => r !== run);
      this.onChange();
    }
  }

  /**
   * The server began a work-done progress. The server makes one for each command's work as it starts
   * it (one after another: a validation, then the same in the interpreter), so it belongs to the
   * earliest running command that has none going.
   */
  progressBegin(token: string, title: string, percentage?: number): void {
    this.progress.set(token, { title, percentage });
    const owner = this.running.find((r) => r.progress === undefined || !this.progress.has(r.progress));
    if (owner) {
      owner.progress = token;
    }
    this.onChange();
  }

  progressReport(token: string, message?: string, percentage?: number): void {
    const p = this.progress.get(token);
    if (p) {
      p.message = message ?? p.message;
      p.percentage = percentage ?? p.percentage;
      this.onChange();
    }
  }

  progressEnd(token: string): void {
    this.progress.delete(token);
    this.onChange();
  }

  /** The server could not start or stopped; undefined clears it. */
  setServerError(message: string | undefined): void {
    this.serverError = message;
    if (message) {
      this.progress.clear();
      for (const state of this.docs.values()) {
        state.analyzing = false;
      }
    }
    this.onChange();
  }

  /** A command running on `uri`, with its progress if it reports some; else progress of no command's. */
  private runningOn(uri: string | undefined): Shown | undefined {
    const run = [...this.running].reverse().find((r) => r.uri === uri);
    const owned = new Set(this.running.map((r) => r.progress));
    const progress = run?.progress !== undefined
      ? this.progress.get(run.progress)
      : [...this.progress.entries()].filter(([token]) => !owned.has(token)).map(([, p]) => p).pop();
    if (progress) {
      const pct = progress.percentage !== undefined ? ` ${progress.percentage}%` : "";
      const title = progress.title.replace(/^fuselens:\s*/, "");
      return {
        text: `$(sync~spin) fuselens: ${title}${pct}`,
        tooltip: progress.message ? `${progress.title}\n${progress.message}` : progress.title,
        error: false,
      };
    }
    if (run) {
      // Begun, with no progress yet or between two (waiting for the worker, or for an answer).
      return { text: `$(sync~spin) fuselens: ${run.doing}…`, tooltip: `fuselens: ${run.doing} this file`, error: false };
    }
    return undefined;
  }

  /** What to show while `activeUri` is the active editor's document. */
  shown(activeUri: string | undefined): Shown {
    if (this.serverError) {
      return { text: "$(error) fuselens", tooltip: `fuselens: ${this.serverError}`, error: true };
    }
    const running = this.runningOn(activeUri);
    if (running) {
      return running;
    }
    const state = activeUri ? this.docs.get(activeUri) : undefined;
    if (!state) {
      return { text: "$(zap) fuselens", tooltip: "fuselens: idle", error: false };
    }
    if (state.analyzing) {
      return { text: "$(sync~spin) fuselens: analyzing", tooltip: "fuselens: analyzing this file", error: false };
    }
    if (state.failure) {
      return { text: "$(error) fuselens: failed", tooltip: state.failure, error: true };
    }
    if (state.problem && state.clusters === 0) {
      // Nothing was analyzed: "0 clusters" would read as "nothing to fuse".
      return { text: `$(warning) fuselens: ${state.problem.words}`, tooltip: state.problem.message, error: true };
    }
    const n = state.clusters;
    return {
      text: `$(zap) fuselens: ${n} cluster${n === 1 ? "" : "s"}`,
      tooltip: `fuselens: ${n} fusable cluster${n === 1 ? "" : "s"} in this file`,
      error: false,
    };
  }
}
