"""``subclass-kit``: the command line.

    subclass-kit check [MODULE:ATTR ...] [--backend B ...] [--json FILE]
    subclass-kit explain MODULE:FN MODULE:INPUTS [--backend B] [--dynamic auto|true|false]
    subclass-kit bench [--quick] [--out DIR]

``check`` runs :func:`subclass_kit.testing.check_subclass` on each target (a class with a
``__samples__`` classmethod, an instance, a list of them or a zero-argument factory), or on
every built-in exemplar when none is given, printing one line per check as it completes
and a summary table; exit 0 when everything passed, 1 when anything failed. ``explain``
prints the guards of the first call's inputs and, over the calls, what dynamo recompiled
and why beside what the kit's guard sets predicted. ``bench`` runs the benchmark suite.
Bad usage (unknown module, missing attribute, bad option) exits 2 with a one-line error.

Layer: the top of ``subclass_kit``; imports the kit, ``guards`` and torch lazily so that
``subclass-kit --help`` is instant.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Sequence

from .testing.parametrize import BACKENDS as DEFAULT_BACKENDS

# Seconds a check row may run (subclass_kit.testing.runner.DEFAULT_TIMEOUT, without
# importing torch here).
DEFAULT_TIMEOUT = 600.0

__all__ = ["main", "UsageError"]

PROG = "subclass-kit"
# Modules whose public classes with __samples__ are the built-in exemplars.
EXEMPLAR_MODULES = ("subclass_kit.examples", "subclass_kit.collectives", "subclass_kit.sharded")
DISTRIBUTED_MODULES = ("subclass_kit.collectives", "subclass_kit.sharded")


class UsageError(Exception):
    """Bad command-line usage: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump, exit 2
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Check, explain and benchmark wrapper tensor subclasses.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="verb", metavar="{check,explain,bench}", parser_class=_Parser)

    c = sub.add_parser("check", help="run the conformance checks on subclasses", description=(
        "Run the conformance checks on each MODULE:ATTR target (a class with __samples__, an "
        "instance, a list, or a zero-argument factory), or on every built-in exemplar."))
    c.add_argument("targets", nargs="*", metavar="MODULE:ATTR")
    c.add_argument("--backend", action="append", metavar="B", help=(
        f"torch.compile backend to check (repeatable; default: {' '.join(DEFAULT_BACKENDS)})"))
    c.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    c.add_argument("--only", action="append", metavar="NAME", help=(
        "run only checks with this name or prefix (repeatable), e.g. --only ctx --only compile"))
    for flag in ("dynamic", "backward", "export", "serialization"):
        c.add_argument(f"--no-{flag}", action="store_true", help=f"skip the {flag} checks")
    c.add_argument("--aoti", action="store_true", help=(
        "also check AOTInductor deployment (slow: one C++ compile per class)"))
    c.add_argument("--opinfo", action="store_true", help=(
        "also run torch's OpInfo database through each class (needs a from_plain classmethod): "
        "one row per op, and a coverage summary"))
    c.add_argument("--ops", metavar="A,B", help="with --opinfo: only these OpInfo ops (comma-separated)")
    c.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help=(
        "seconds a check row (or an OpInfo op) may run before it fails as a hang "
        "(default: 600; 0: no limit)"))
    c.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown to FILE")
    c.add_argument("-q", "--quiet", action="store_true", help="print only failures and the summary")
    c.set_defaults(func=_cmd_check)

    e = sub.add_parser("explain", help="show guards and recompile reasons for a function", description=(
        "Print the guards dynamo installs for the first call's inputs and, over all calls, what "
        "recompiled and why, beside the kit's prediction. INPUTS is a list of argument tuples "
        "(or a zero-argument function returning one)."))
    e.add_argument("fn", metavar="MODULE:FN")
    e.add_argument("inputs", metavar="MODULE:INPUTS")
    e.add_argument("--backend", default="eager", metavar="B", help="dynamo backend (default: eager)")
    e.add_argument("--dynamic", choices=("auto", "true", "false"), default="auto",
                   help="as torch.compile(dynamic=None/True/False) (default: auto)")
    e.set_defaults(func=_cmd_explain)

    b = sub.add_parser("bench", help="run the benchmark suite", description=(
        "Run the benchmarks against torch's own subclasses; write bench.json, bench.md and bench.png."))
    b.add_argument("--quick", action="store_true", help="fewer repetitions")
    b.add_argument("--out", default="bench-out", metavar="DIR", help="output directory (default: bench-out)")
    b.set_defaults(func=_cmd_bench)
    return p


# ---- loading targets ----------------------------------------------------------------------------
def _import_module(spec: str):
    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec if spec.endswith(".py") else spec + ".py")
        if not os.path.isfile(path):
            raise UsageError(f"no such file: {spec}")
        name = os.path.splitext(os.path.basename(path))[0]
        folder = os.path.dirname(path)
        # The folder goes on sys.path, so the module is importable by its name here and in
        # the checker's child processes (which inherit sys.path), wherever we run from.
        if folder not in sys.path:
            sys.path.insert(0, folder)
        loaded = sys.modules.get(name)
        if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") == path:
            return loaded  # `file.py:A` and `file:B` name one module: never load it twice
        loader = importlib.util.spec_from_file_location(name, path)
        assert loader is not None and loader.loader is not None  # a .py path always has one
        mod = importlib.util.module_from_spec(loader)
        sys.modules[name] = mod
        try:
            loader.loader.exec_module(mod)
        except SystemExit as e:
            sys.modules.pop(name, None)
            raise UsageError(_exit_message(spec, e)) from None
        except Exception as e:
            raise UsageError(f"importing {spec} raised {type(e).__name__}: {_one_line(e)}") from None
        return mod
    loaded = sys.modules.get(spec)
    if loaded is not None:
        return loaded
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name and spec.startswith(e.name):
            raise UsageError(f"cannot import module {spec!r} ({e}); is it on PYTHONPATH?") from None
        raise UsageError(f"importing {spec} raised ModuleNotFoundError: {e}") from None
    except SystemExit as e:
        raise UsageError(_exit_message(spec, e)) from None
    except Exception as e:
        raise UsageError(f"importing {spec} raised {type(e).__name__}: {_one_line(e)}") from None


def _exit_message(spec: str, e: SystemExit) -> str:
    return (f"importing {spec} called sys.exit({e.code!r}): a target module must not exit at import "
            "(move the script part under `if __name__ == \"__main__\":`)")


_IMPORT_OK = "__subclass_kit_import_ok__"
_IMPORT_EXIT = "__subclass_kit_import_exit__"


def _probe_import(spec: str, timeout) -> None:
    """Import ``spec`` in a child interpreter first: a module that exits or kills its process
    at import (``os._exit``, a signal) cannot be caught in this process, and would end the
    check with its own exit status and no verdict."""
    if spec in sys.modules:
        return
    import subprocess

    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec if spec.endswith(".py") else spec + ".py")
        if not os.path.isfile(path):
            raise UsageError(f"no such file: {spec}")
        body = (f"import importlib.util, sys; sys.path.insert(0, {os.path.dirname(path)!r}); "
                f"s = importlib.util.spec_from_file_location({os.path.splitext(os.path.basename(path))[0]!r}, {path!r}); "
                "m = importlib.util.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)")
    else:
        body = f"import importlib; importlib.import_module({spec!r})"
    code = (f"import sys; sys.path[:0] = {list(sys.path)!r}\ntry:\n    {body}\nexcept SystemExit as e:\n"
            f"    print({_IMPORT_EXIT!r}, repr(e.code), flush=True)\n    raise\nprint({_IMPORT_OK!r}, flush=True)")
    limit = DEFAULT_TIMEOUT if timeout is None else (timeout or None)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise UsageError(f"importing {spec} did not finish within {limit:g}s (a hang at import?)") from None
    if _IMPORT_OK in proc.stdout:
        return
    for line in proc.stdout.splitlines():
        if line.startswith(_IMPORT_EXIT):
            raise UsageError(
                f"importing {spec} called sys.exit({line[len(_IMPORT_EXIT):].strip()}): a target module must "
                "not exit at import (move the script part under `if __name__ == \"__main__\":`)"
            )
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    last = f": {err[-1].strip()[:200]}" if err else ""
    if proc.returncode < 0:
        import signal

        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        raise UsageError(f"importing {spec} killed its process ({sig}){last}; a target module must import cleanly")
    if "Traceback" in proc.stderr and "SystemExit" not in proc.stderr:
        return  # an ordinary exception: the in-process import reports it with its message
    raise UsageError(
        f"importing {spec} ended its process with exit status {proc.returncode} (sys.exit or os._exit at "
        f"import){last}; a target module must import cleanly (move the script part under "
        "`if __name__ == \"__main__\":`)"
    )


def load_target(target: str):
    """The object named by ``MODULE:ATTR`` (ATTR may be dotted; MODULE may be a .py path)."""
    _check_syntax(target)
    mod_name, attr = target.rsplit(":", 1)
    obj = _import_module(mod_name)
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"{mod_name} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    return obj


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def builtin_targets() -> list:
    """``(label, class)`` for every built-in exemplar with ``__samples__``, in module order."""
    import torch

    out = []
    for mod_name in EXEMPLAR_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue  # not written yet, or an optional dependency is missing
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name, None)
            if isinstance(obj, type) and issubclass(obj, torch.Tensor) and hasattr(obj, "__samples__"):
                out.append((f"{mod_name}:{name}", obj))
    return out


class _SingleRankGroup:
    """A one-rank gloo group on 127.0.0.1 for distributed exemplars, if none exists."""

    def __init__(self):
        self.mine = False

    def __enter__(self):
        import socket

        import torch.distributed as dist

        if dist.is_available() and not dist.is_initialized():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
            self.mine = True
        return self

    def __exit__(self, *exc):
        if self.mine:
            import torch.distributed as dist

            dist.destroy_process_group()


# ---- check --------------------------------------------------------------------------------------
def _check_syntax(target: str) -> None:
    if ":" not in target or target.endswith(":") or target.startswith(":"):
        raise UsageError(f"target {target!r} must be MODULE:ATTR, e.g. mypkg.tensors:MyTensor")


def _cmd_check(args) -> int:
    # Usage errors that need no import come first, so they are reported instantly.
    for t in args.targets:
        _check_syntax(t)
    for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                raise UsageError(f"{flag} {path}: directory {folder} does not exist")
    if args.ops and not args.opinfo:
        raise UsageError("--ops selects OpInfo ops and needs --opinfo")
    if args.timeout is not None and args.timeout < 0:
        raise UsageError(f"--timeout {args.timeout:g}: must be seconds >= 0 (0: no limit)")
    sys.path.insert(0, os.getcwd())
    # One probe per module: several targets from one module (`m:A m:B`) import it once.
    for spec in dict.fromkeys(t.rsplit(":", 1)[0] for t in args.targets):
        _probe_import(spec, args.timeout)
    targets = [(t, load_target(t)) for t in args.targets] if args.targets else builtin_targets()
    backends = tuple(args.backend) if args.backend else DEFAULT_BACKENDS
    _validate_backends(backends)

    from .testing.report import format_row, format_summary
    from .testing.runner import UnknownCheckError, check_subjects
    from .testing.errors import SamplesError
    from .testing._subject import resolve

    if not targets:
        raise UsageError("no targets given and no built-in exemplars found")
    needs_group = any(getattr(obj, "__module__", "").startswith(DISTRIBUTED_MODULES) for _, obj in targets)

    def on_row(row):
        if not args.quiet or row.status == "fail":
            print(format_row(row), flush=True)

    group = _SingleRankGroup() if needs_group else None
    if group is not None:
        group.__enter__()
    try:
        subjects = []
        for label, obj in targets:
            try:
                subjects += resolve(obj)
            except SamplesError as e:
                raise UsageError(f"{label}: {e}") from None
            except SystemExit as e:
                raise UsageError(f"{label}: making the samples called sys.exit({e.code!r})") from None
            except Exception as e:
                raise UsageError(f"{label}: cannot make samples: {type(e).__name__}: {_one_line(e)}") from None
        t0 = time.perf_counter()
        reports = check_subjects(
            subjects,
            backends=backends,
            dynamic=not args.no_dynamic,
            backward=not args.no_backward,
            export=not args.no_export,
            serialization=not args.no_serialization,
            only=args.only,
            on_row=on_row,
            aoti=args.aoti,
            opinfo=(args.ops or True) if args.opinfo else False,
            timeout=DEFAULT_TIMEOUT if args.timeout is None else args.timeout,
        )
    except UnknownCheckError as e:  # a typo in --only: a usage error, not a run of 0 checks
        raise UsageError(str(e).removeprefix("check_subclass: ").replace("only=", "--only ")) from None
    except ValueError as e:
        if "OpInfo" not in str(e):
            raise
        raise UsageError(f"--ops: {e}") from None
    finally:
        if group is not None:
            group.__exit__(None, None, None)
    wall = time.perf_counter() - t0
    ok = all(r.ok for r in reports)
    print()
    print(format_summary(reports))
    fails = [(r.subject, row) for r in reports for row in r.failures]
    if fails:
        print(f"\n{len(fails)} failing check(s):")
        for subject, row in fails:
            print(f"  {subject} {row.name}: {row.message}")
    coverage = [r for r in reports if r.coverage() is not None]
    if coverage:
        print("\nOpInfo coverage:")
        for r in coverage:
            print(f"  {r.coverage_line()}")
            for outcome, names in r.coverage()["by_outcome"].items():
                if names:
                    print(f"    {outcome}: {', '.join(names)}")
    verdict = "all checks passed" if ok else f"FAILED ({len(fails)} failing)"
    print(f"\n{verdict} in {wall:.1f}s (backends: {', '.join(backends)})")
    tot = {k: sum(r.counts().get(k, 0) for r in reports) for k in ("pass", "fail", "skip")}
    print(f"{tot['pass']} passed, {tot['fail']} failed, {tot['skip']} skipped in {wall:.1f}s")
    if args.json:
        import torch

        doc = {
            "version": 1,
            "ok": ok,
            "torch": torch.__version__,
            "backends": list(backends),
            "seconds": round(wall, 3),
            "reports": [r.to_json() for r in reports],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.markdown:
        head = [f"# subclass-kit check: {'all checks passed' if ok else 'FAILED'}", "",
                f"{tot['pass']} passed, {tot['fail']} failed, {tot['skip']} skipped in {wall:.1f}s "
                f"(backends: {', '.join(backends)})", ""]
        with open(args.markdown, "w") as f:
            f.write("\n".join(head) + "\n" + "\n".join(r.to_markdown() for r in reports))
    return 0 if ok else 1


def _validate_backends(backends) -> None:
    if all(b in DEFAULT_BACKENDS for b in backends):
        return
    from . import _compat

    known = set(_compat.list_backends()) | set(DEFAULT_BACKENDS)
    for b in backends:
        if b not in known:
            close = difflib.get_close_matches(b, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"unknown backend {b!r}{hint}")


# ---- explain ------------------------------------------------------------------------------------
def _calls(inputs) -> list:
    if callable(inputs) and not isinstance(inputs, (list, tuple)):
        inputs = inputs()
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise UsageError("INPUTS must be a non-empty list of argument tuples (or a function returning one)")
    return [tuple(a) if isinstance(a, (tuple, list)) else (a,) for a in inputs]


def _param_names(fn, n: int) -> tuple:
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    params = params[:n]
    return tuple(params) + tuple(f"arg{i}" for i in range(len(params), n))


def _cmd_explain(args) -> int:
    _check_syntax(args.fn)
    _check_syntax(args.inputs)
    sys.path.insert(0, os.getcwd())
    fn = load_target(args.fn)
    if not callable(fn):
        raise UsageError(f"{args.fn} is a {type(fn).__name__}, not a function")
    try:
        calls = _calls(load_target(args.inputs))
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"{args.inputs}: cannot make the inputs: {type(e).__name__}: {_one_line(e)}") from None
    dynamic = {"auto": None, "true": True, "false": False}[args.dynamic]
    _validate_backends((args.backend,))
    import guards

    build_call = getattr(guards, "build_call", None)
    explain_recompiles = getattr(guards, "explain_recompiles", None)
    names = _param_names(fn, len(calls[0]))
    if build_call is None or explain_recompiles is None:
        print("subclass-kit explain: this install's guards package lacks build_call/explain_recompiles; "
              "showing dynamo's own recompile count only.")
        return _explain_fallback(fn, calls, args.backend, dynamic)
    gs = build_call(calls[0], names, dynamic=dynamic)
    print(f"guards for call 0 of {args.fn}({', '.join(names)}): {len(gs)} guards")
    for line in gs.describe():
        print(f"  {line}")
    _print_shape_notes(calls[0], names)
    report = explain_recompiles(fn, calls, backend=args.backend, dynamic=dynamic)
    print(f"\nrecompiles over {len(calls)} calls:")
    for line in report.lines():
        print(f"  {line}")
    return 0


def _print_shape_notes(args, names) -> None:
    """Sizes that will recompile although they could be dynamic (a FREE inner size left
    static, a derived inner size of 0 or 1), per tensor input."""
    import torch

    import symbolic

    for name, a in zip(names, args):
        if isinstance(a, torch.Tensor):
            for note in symbolic.describe(a).notes(name):
                print(f"  note: {name}: {note}")


def _explain_fallback(fn, calls, backend, dynamic) -> int:
    import torch

    from . import _compat

    _compat.dynamo_reset()
    cnt = _compat.compile_counter(backend)
    cfn = torch.compile(fn, backend=cnt, dynamic=dynamic)
    for i, args in enumerate(calls):
        before = cnt.frame_count
        cfn(*args)
        print(f"call {i}: {'compiled' if cnt.frame_count > before else 'reused'}")
    for r in _compat.guard_failure_reasons():
        print(f"  dynamo: {r.strip()}")
    return 0


# ---- bench --------------------------------------------------------------------------------------
def _cmd_bench(args) -> int:
    try:
        from . import bench
    except ImportError as e:
        raise UsageError(f"the benchmark suite is not available: {e}") from None
    run = getattr(bench, "main", None)
    if run is None:
        raise UsageError("the benchmark suite is not available in this install (subclass_kit.bench.main is missing)")
    # Progress (suite started / finished, chart written or not) is logged by the suite.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("subclass_kit.bench")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        rows = run(quick=args.quick, out=args.out)
    finally:
        log.removeHandler(handler)
    table = getattr(bench, "markdown_table", None)
    if rows and table is not None:
        print(table(rows))
    written = [f for f in ("bench.json", "bench.md", "bench.png") if os.path.exists(os.path.join(args.out, f))]
    print(f"\nwrote {', '.join(written) or 'nothing'} into {args.out} ({len(rows or [])} rows)")
    if "bench.png" not in written:
        print("no chart: it needs matplotlib, pip install 'subclass-kit[bench]'")
    return 0


# ---- entry point --------------------------------------------------------------------------------
# Deprecation notices that torch 2.13 raises from inside its own compiler while the checks
# compile: nothing a user of this command can act on, so the command does not print them.
_TORCH_INTERNAL_NOTICES = (
    (r"`torch\._prims_common\.check` is deprecated", FutureWarning),
    (r".*torch\.jit\.script_method. is deprecated", DeprecationWarning),
    (r".*isinstance.treespec, LeafSpec.* is deprecated", FutureWarning),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``subclass-kit`` command line; returns the exit status.

    Example:
        >>> from subclass_kit.cli import main
        >>> main(["check", "no_such_module:X"])
        2
    """
    for message, category in _TORCH_INTERNAL_NOTICES:
        warnings.filterwarnings("ignore", message=message, category=category)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.version:
            from importlib.metadata import PackageNotFoundError, version

            try:
                print(f"{PROG} {version('subclass-kit')}")
            except PackageNotFoundError:
                print(f"{PROG} (not installed)")
            return 0
        if args.verb is None:
            parser.print_help()
            return 0
        return args.func(args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
