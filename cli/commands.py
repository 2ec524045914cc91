"""`fuselens`: the command line.

    fuselens analyze FILE [--model-class C] [--input-shape 16384,1024 ...] [--dtype float32]
                          [--json OUT] [--out-dir DIR] [--explain-rejections] [--device h200]
    fuselens apply FILE ... [--yes]
    fuselens restore FILE [--kernel cluster0 ...] [--yes]
    fuselens validate FILE ... [--interpret] [--json OUT] [--markdown OUT] [--html OUT]
    fuselens validate FILE --probe [--data pkg.mod:fn] [--batches 8] [--on cuda|cpu] [--json OUT] [--html OUT]
    fuselens profile FILE ... [--iterations 10] [--warmup 3] [--on cuda|cpu] [--train] [--full-size]
                              [--json OUT] [--html OUT] [--save-corpus]
    fuselens probe FILE [--model NAME] [--data pkg.mod:fn] [--synthetic normal|heavy|sparse] [--batches 8]
                        [--sample-every N] [--on cuda|cpu] [--json OUT] [--markdown OUT] [--html OUT]
    fuselens serve [--stdio]

Each exits non-zero, with a line that says why, when it could not do what was asked.

torch is imported only by the commands that run models, so `serve` starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from fuselens.contracts.config import ConfigError
from fuselens.contracts.options import DEVICE_PROFILES, AnalyzeOptions
from fuselens.contracts.probe import DISTRIBUTIONS
from fuselens.contracts.report import Report

from .option_values import device_name, non_negative_int, positive_int, positive_number


def _probe_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a probe's batches come from, how many, how sampled, and where it runs."""
    parser.add_argument(
        "--data",
        metavar="PKG.MOD:FN",
        help="a function (no arguments) returning or yielding batches: a tensor or a tuple of tensors, the "
        "forward's positional inputs (default: [tool.fuselens] probe-data, the file's probe_batches(), "
        "synthetic inputs of the declared shapes)",
    )
    parser.add_argument(
        "--synthetic",
        choices=list(DISTRIBUTIONS),
        default="normal",
        help="the distribution of synthetic inputs, when no data is given (default normal)",
    )
    parser.add_argument("--batches", type=positive_int, default=8, help="batches to run (default 8)")
    parser.add_argument(
        "--sample-every",
        type=positive_int,
        help="sketch one call in N of each site (default: [tool.fuselens] probe-sample-every, else 1)",
    )
    parser.add_argument("--on", choices=["cuda", "cpu"], help="where to run (default: CUDA where there is one)")


def _analysis_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="Python file that defines nn.Module classes")
    parser.add_argument("--model-class", help="analyze only this class")
    parser.add_argument(
        "--input-shape",
        action="append",
        metavar="SHAPE",
        help="example input shape, e.g. 16384,1024 (repeat for several inputs)",
    )
    parser.add_argument(
        "--dtype",
        action="append",
        metavar="DTYPE",
        help="input dtype (float32, bfloat16, int64, ...): one for all inputs or one per input",
    )
    parser.add_argument(
        "--dim",
        action="append",
        metavar="NAME=MIN..MAX[@SIZES]",
        help="the range of a size the input shapes name, e.g. --input-shape 4,seq,1024 --dim seq=1..8192@1,128,2048 "
        "(sizes: where per-shape answers are given; default: the ends and a few powers of two between)",
    )
    parser.add_argument("--param-dtype", help="cast the model's parameters, e.g. bfloat16")
    parser.add_argument(
        "--device",
        type=device_name,
        help=f"device profile for regimes: {', '.join(DEVICE_PROFILES)} (the first is the default)",
    )
    parser.add_argument(
        "--peak-gbps", type=positive_number, help="override the device's DRAM bandwidth (GB/s, above 0)"
    )
    parser.add_argument("--out-dir", help="where the kernel module goes (default: beside FILE)")


def build_parser() -> argparse.ArgumentParser:
    from fuselens.contracts.version import TOOL_VERSION

    parser = argparse.ArgumentParser(prog="fuselens", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"fuselens {TOOL_VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)

    analyze = sub.add_parser("analyze", help="find fusable clusters and print a report")
    _analysis_arguments(analyze)
    analyze.add_argument("--json", metavar="OUT", help="write the JSON report to OUT ('-' for stdout)")
    analyze.add_argument("--explain-rejections", action="store_true", help="list ops left unfused and why")
    analyze.add_argument("--show-kernels", action="store_true", help="print each generated kernel")
    analyze.add_argument(
        "--train",
        action="store_true",
        help="analyze the models in training mode (model.train()): dropout and batch-statistics BatchNorm stay unfused",
    )
    analyze.add_argument(
        "--vs-inductor",
        action="store_true",
        help="also compile with torch.compile and compare its fusions with ours (slower)",
    )

    apply = sub.add_parser("apply", help="write the kernel module, replace exact clusters and rewrite patterns in FILE")
    _analysis_arguments(apply)
    apply.add_argument(
        "--cluster", action="append", help="apply only these cluster ids (c0, c1, ...) and rewrite ids (r0, ...)"
    )
    apply.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    apply.add_argument(
        "--no-check",
        action="store_true",
        help="apply without validating first (by default each kernel, and each model patched as a whole, "
        "is checked against the code as written, and what fails is not applied)",
    )
    apply.add_argument(
        "--interpret", action="store_true", help="validate in the Triton interpreter on CPU (the default without a GPU)"
    )

    restore = sub.add_parser("restore", help="put back the code `apply` replaced in FILE")
    restore.add_argument("file")
    restore.add_argument(
        "--kernel", action="append", help="restore only these kernels (cluster0, ...) and rewrites (rewrite_<digest>)"
    )
    restore.add_argument("--out-dir", help="where apply wrote the kernel module (default: beside FILE)")
    restore.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    validate = sub.add_parser("validate", help="check generated kernels against eager (and time them on a GPU)")
    _analysis_arguments(validate)
    validate.add_argument("--interpret", action="store_true", help="run kernels in the Triton interpreter on CPU")
    validate.add_argument("--cluster", action="append", help="validate only these cluster ids")
    validate.add_argument("--json", metavar="OUT", help="write the validation results as JSON")
    validate.add_argument(
        "--markdown", metavar="OUT", help="write the results table (as the editors' results view shows it) to OUT"
    )
    validate.add_argument(
        "--html",
        metavar="OUT",
        help="write the results view (tables, chart, earlier runs) as a self-contained HTML page to OUT (needs plotly)",
    )
    validate.add_argument(
        "--no-benchmark", action="store_true", help="on a GPU, check numerics only (by default kernels are also timed)"
    )
    validate.add_argument(
        "--probe",
        action="store_true",
        help="probe the models on data (as `fuselens probe`) and measure each opportunity it names with "
        "PyTorch's kernels against the dense GEMM: the output error anywhere, the time on a GPU",
    )
    _probe_arguments(validate)

    profile = sub.add_parser("profile", help="measure where the forward's time goes, by line and by cluster")
    _analysis_arguments(profile)
    profile.add_argument("--iterations", type=positive_int, default=10, help="forwards to profile (default 10)")
    profile.add_argument(
        "--warmup", type=non_negative_int, default=3, help="forwards run first, not profiled (default 3)"
    )
    profile.add_argument("--on", choices=["cuda", "cpu"], help="where to run (default: CUDA where there is one)")
    profile.add_argument(
        "--train",
        action="store_true",
        help="profile a training step: the forward in training mode, then the backward of its outputs",
    )
    profile.add_argument("--json", metavar="OUT", help="write the report, with its profile section, to OUT")
    profile.add_argument("--markdown", metavar="OUT", help="write the lines by time, per model, as markdown to OUT")
    profile.add_argument(
        "--html",
        metavar="OUT",
        help="write the profile (tables and chart) as a self-contained HTML page (needs plotly)",
    )
    profile.add_argument(
        "--full-size",
        action="store_true",
        help="on a CPU, profile at the analyzed input shapes (by default smaller ones, within a budget of "
        "memory and time, with the same clusters)",
    )
    profile.add_argument("--top", type=positive_int, default=12, help="lines to list (default 12)")
    profile.add_argument(
        "--save-corpus",
        action="store_true",
        help="print the sizes each model with declared dynamic sizes was called at as its dims' corpus, "
        "the pyproject.toml table to put in place of its own",
    )

    probe = sub.add_parser("probe", help="run the models on data and sketch what flows through each GEMM")
    _analysis_arguments(probe)
    probe.add_argument("--model", dest="model_class", help="probe only this model (as --model-class)")
    _probe_arguments(probe)
    probe.add_argument("--json", metavar="OUT", help="write the probe report as JSON to OUT ('-' for stdout)")
    probe.add_argument("--markdown", metavar="OUT", help="write the results view's tables (as the editors show them)")
    probe.add_argument(
        "--html", metavar="OUT", help="write the results view (each site's value distribution charted) as a page"
    )

    serve = sub.add_parser("serve", help="run the language server")
    serve.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    serve.add_argument("--log-file", help="also write the server log here")
    return parser


def _options(args: argparse.Namespace) -> AnalyzeOptions:
    return AnalyzeOptions(
        model_class=args.model_class,
        input_shapes=args.input_shape,
        dtypes=args.dtype,
        dims=args.dim,
        param_dtype=args.param_dtype,
        device=args.device,
        peak_gbps=args.peak_gbps,
        out_dir=args.out_dir,
        train=getattr(args, "train", False),
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from fuselens.server.start import serve

        return serve(log_file=args.log_file)
    if not os.path.isfile(args.file):
        print(f"fuselens: no such file: {args.file}", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        return _run(args)
    except OSError as exc:  # a file to write that cannot be (a read-only file system, no such folder)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"fuselens: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "analyze":
        return _analyze(args)
    if args.command == "apply":
        from fuselens.cli.apply import run_apply

        return run_apply(args, _options(args))
    if args.command == "restore":
        from fuselens.cli.restore import run_restore

        return run_restore(args)
    if args.command == "validate" and args.probe:
        from fuselens.cli.probe import run_probe

        return run_probe(args, _options(args), measure=True)
    if args.command == "validate":
        from fuselens.cli.validate import run_validate

        return run_validate(args, _options(args))
    if args.command == "profile":
        from fuselens.cli.profile import run_profile

        return run_profile(args, _options(args))
    if args.command == "probe":
        from fuselens.cli.probe import run_probe

        return run_probe(args, _options(args))
    return 2


def _analyze(args: argparse.Namespace) -> int:
    from fuselens.cli.render import render_report
    from fuselens.pipeline.analyze import analyze

    try:
        analyzed = analyze(args.file, _options(args))
    except ConfigError as exc:
        print(f"fuselens: {exc}", file=sys.stderr)
        return 2
    report = analyzed.report
    if args.vs_inductor:
        from fuselens.pipeline.compare import compare

        compare(analyzed, _print_progress)
    data = report.to_dict()
    if args.json:
        from fuselens.contracts.schema import validate_report

        validate_report(data)
        text = json.dumps(data, indent=2)
        if args.json == "-":
            print(text)
            return _exit_code(report)
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    render_report(report, explain_rejections=args.explain_rejections, show_kernels=args.show_kernels)
    return _exit_code(report)


def _print_progress(message: str, fraction: float | None = None) -> None:
    print(f"… {message}", file=sys.stderr)


def _exit_code(report: Report) -> int:
    """1 when the file, or a model of it, could not be analyzed (the report says why), or no model of it
    was; 0 otherwise (findings are not failures)."""
    from fuselens.pipeline.unanalyzed import unanalyzed_models

    return 1 if report.problems or unanalyzed_models(report) else 0
