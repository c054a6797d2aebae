"""`subclass-kit` end to end, as a user runs it: a subprocess per command, exit codes and
output. Uses the installed console script when there is one, else ``python -m
subclass_kit.cli`` (the same ``main``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from kit_helpers.processes import TESTS, cli_command, cli_env, run_clis

# What the file-based commands import, each written to a folder of its own.
PAIRS_ELSEWHERE = """
    import sys
    sys.path.insert(0, %r)
    from broken_subclasses import GoodPair

    class PairA(GoodPair):
        pass

    class PairB(GoodPair):
        pass
""" % os.path.dirname(os.path.abspath(__file__))

MYTENSORS = """
    import torch
    from torch.testing._internal.two_tensor import TwoTensor
    one = TwoTensor(torch.ones(2, 3), torch.zeros(2, 3))
    several = [one, TwoTensor(torch.ones(4, 2), torch.ones(4, 2))]
    def make():
        return TwoTensor(torch.ones(3, 3), torch.ones(3, 3))
"""

EXPLAIN_PROG = """
    import torch
    from subclass_kit.examples import BlockScaled

    def f(x):
        return x * 2.0

    def inputs():
        a = BlockScaled.from_float(torch.randn(64, 8), block=32)
        b = BlockScaled.from_float(torch.randn(64, 8), block=32)
        c = BlockScaled.from_float(torch.randn(64, 8), block=16)
        return [(a,), (b,), (c,)]
"""

BAD_USAGE = [
    (["check", "no_such_module_xyz:Thing"], "cannot import module 'no_such_module_xyz'"),
    (["check", "broken_subclasses:GoodPai"], "has no attribute 'GoodPai'; did you mean GoodPair?"),
    (["check", "broken_subclasses"], "must be MODULE:ATTR"),
    (["check", "--backend", "indcutor"], "unknown backend 'indcutor'; did you mean inductor"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["check", "broken_subclasses:PairMeta"], "PairMeta has no __samples__() classmethod"),
]


@pytest.fixture(scope="module")
def cli_root(tmp_path_factory):
    """The folder the module's runs read their files from and write their reports to."""
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def runs(cli_root) -> dict:
    """Every plain ``subclass-kit`` run of this module, one process each as a user runs it,
    a few at a time (each interpreter spends seconds importing torch and dynamo, the same
    whether the runs are one after another or side by side); each test reads its own."""
    root = cli_root

    def folder(name: str, files: dict) -> str:
        (root / name).mkdir()
        for f, text in files.items():
            (root / name / f).write_text(textwrap.dedent(text))
        return str(root / name)

    elsewhere = folder("files", {"pairs_elsewhere.py": PAIRS_ELSEWHERE})
    (root / "files" / "elsewhere").mkdir()
    tensors = folder("tensors", {"mytensors.py": MYTENSORS})
    prog = folder("explain", {"prog.py": EXPLAIN_PROG})
    bad_prog = folder("explain_bad", {"prog.py": "def f(x):\n    return x\nINPUTS = []\n"})
    commands = {
        "help": [],
        "bench help": ["bench", "--help"],
        "broken": ["check", "broken_subclasses:TensorInCtx", "--backend", "eager", "--only", "ctx"],
        "only typo": ["check", "broken_subclasses:GoodPair", "--backend", "eager", "--only", "compiel"],
        # one target by path, one by module name: one module, found by the hash child too
        "files": (["check", f"{elsewhere}/pairs_elsewhere.py:PairA", "pairs_elsewhere:PairB", "--backend", "eager",
                   "--only", "identity"], f"{elsewhere}/elsewhere"),
        "instances": (["check", "mytensors:one", "mytensors:several", f"{tensors}/mytensors.py:make", "--backend",
                       "eager", "--only", "protocol"], tensors),
        "explain": (["explain", "prog:f", "prog:inputs", "--dynamic", "false"], prog),
        "explain bad": (["explain", "prog:f", "prog:INPUTS"], bad_prog),
        "opinfo no target": ["check", "--opinfo", "--ops", "neg,mm", "--only", "opinfo", "--backend", "eager"],
        "opinfo": ["check", "subclass_kit.examples:TwoTensor", "--opinfo", "--ops", "neg,mm", "--only", "opinfo",
                   "--backend", "eager", "--json", str(root / "opinfo.json"), "--markdown", str(root / "opinfo.md")],
        "ops without opinfo": ["check", "subclass_kit.examples:TwoTensor", "--ops", "neg"],
        "opinfo typo": ["check", "subclass_kit.examples:TwoTensor", "--opinfo", "--ops", "nge", "--backend", "eager"],
        **{tuple(args): args for args, _ in BAD_USAGE},
    }
    return dict(zip(commands, run_clis(*commands.values(), jobs=4)))


def test_no_verb_prints_help(runs):
    r = runs["help"]
    assert r.returncode == 0, r.stderr
    for verb in ("check", "explain", "bench"):
        assert verb in r.stdout
    assert r.stderr == ""


def test_check_builtin_exemplars_streams_rows_and_writes_json(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.Popen(
        [*cli_command(), "check", "--backend", "aot_eager", "--json", str(out)],
        cwd=TESTS, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    first = proc.stdout.readline()
    # One line per check as it completes: the first row arrives while the run goes on.
    still_running = proc.poll() is None
    rest, err = proc.communicate(timeout=600)
    lines = [first] + rest.splitlines()
    assert still_running
    assert first.startswith("PASS") and "TwoTensor" in first and "protocol.flatten" in first
    doc = json.loads(out.read_text())
    assert doc["version"] == 1 and doc["backends"] == ["aot_eager"]
    assert proc.returncode == (0 if doc["ok"] else 1), err
    subjects = {r["subject"]: r for r in doc["reports"]}
    for name in ("TwoTensor", "ScaledTensor", "BlockScaled"):
        report = subjects[name]
        assert report["ok"], [r for r in report["rows"] if r["status"] == "fail"]
        for row in report["rows"]:
            assert set(row) == {"name", "status", "seconds", "message", "subject"}
            assert row["status"] in ("pass", "fail", "skip")
    rows = sum(len(r["rows"]) for r in doc["reports"])
    row_lines = [ln for ln in lines if ln.split(" ", 1)[0] in ("PASS", "FAIL", "skip")]
    assert len(row_lines) == rows, (rows, lines)
    text = "\n".join(lines)
    assert "subject" in text and "pass  fail  skip" in text and "\ntotal " in text
    assert ("all checks passed" in text) == doc["ok"]
    assert "Traceback" not in err


def test_check_a_broken_class_exits_1_and_says_what_is_wrong(runs):
    r = runs["broken"]
    assert r.returncode == 1, r.stdout + r.stderr
    fail_lines = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL ")]
    assert any("TensorInCtx" in ln and "ctx.tensor_free" in ln and "holds a tensor" in ln and "Fix:" in ln for ln in fail_lines)
    n = len(fail_lines)
    assert f"FAILED ({n} failing)" in r.stdout
    # pytest-like last line, counting every row printed
    passed = sum(ln.startswith("PASS") for ln in r.stdout.splitlines())
    assert r.stdout.strip().splitlines()[-1].startswith(f"{passed} passed, {n} failed, 0 skipped in ")


def test_check_only_with_an_unknown_name_is_a_usage_error(runs):
    r = runs["only typo"]
    assert r.returncode == 2, r.stdout + r.stderr
    assert "compiel" in r.stderr and "selects no check" in r.stderr
    assert "compile" in r.stderr and "ctx.hashable" in r.stderr  # the valid names are listed
    assert "PASS" not in r.stdout


def test_file_targets_from_another_folder_load_once(runs):
    r = runs["files"]
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith(("PASS", "FAIL", "skip"))]
    assert len(rows) == 4 and all(ln.startswith("PASS") for ln in rows), rows


def test_check_accepts_instances_lists_and_factories_from_a_file(runs):
    r = runs["instances"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASS") == 3 * 8 and "all checks passed" in r.stdout


@pytest.mark.parametrize(
    "args, words", BAD_USAGE,
    ids=["unknown-module", "missing-attribute", "not-module-attr", "bad-backend", "bad-verb", "no-samples"],
)
def test_bad_usage_exits_2_with_one_line_and_no_traceback(args, words, runs):
    r = runs[tuple(args)]
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, r.stderr
    assert err[0].startswith("subclass-kit: error: ") and words in err[0]
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_explain_prints_guards_and_recompile_reasons_beside_the_prediction(runs):
    r = runs["explain"]
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "guards for call 0 of prog:f(x):" in out
    assert "type(L['x']) is subclass_kit.examples.block_scaled.BlockScaled" in out
    assert "block=32" in out
    assert "recompiles over 3 calls:" in out
    assert "call 0: compiled (predicted compile)" in out
    assert "call 1: reused (predicted reuse)" in out
    assert "call 2: compiled (predicted compile)" in out
    assert "dynamo: " in out and "kit: " in out and "agrees" in out


def test_explain_bad_target_is_bad_usage(runs):
    r = runs["explain bad"]
    assert r.returncode == 2 and "non-empty list of argument tuples" in r.stderr


def test_bench_help_and_dispatch(runs, tmp_path, monkeypatch, capsys):
    r = runs["bench help"]
    assert r.returncode == 0 and "--quick" in r.stdout and "--out" in r.stdout
    # The verb only dispatches to subclass_kit.bench.main (tested with the suite itself).
    from subclass_kit import bench, cli

    seen = {}

    def fake_main(quick, out):
        seen.update(quick=quick, out=out)
        return [{"name": "x", "median_us": 1.0}]

    monkeypatch.setattr(bench, "main", fake_main)
    assert cli.main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    assert seen == {"quick": True, "out": str(tmp_path)}
    assert "| x | 1.0 |" in capsys.readouterr().out


def test_explain_degrades_clearly_without_the_guards_explainer(tmp_path, monkeypatch, capsys):
    """An install whose guards package predates explain_recompiles still answers (in-process)."""
    import guards

    from subclass_kit import cli

    (tmp_path / "prog2.py").write_text(textwrap.dedent("""
        import torch
        def f(x):
            return x + 1
        INPUTS = [(torch.ones(3),), (torch.ones(3),), (torch.ones(5),)]
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delattr(guards, "explain_recompiles")
    assert cli.main(["explain", "prog2:f", "prog2:INPUTS", "--dynamic", "false"]) == 0
    out = capsys.readouterr().out
    assert "lacks build_call/explain_recompiles" in out
    assert out.count("compiled") == 2 and "call 1: reused" in out
    assert "dynamo: " in out and "size mismatch" in out


@pytest.mark.parametrize(
    "body, words",
    [
        ("import sys\nsys.exit(0)", "called sys.exit(0)"),
        ("import sys\nsys.exit(3)", "called sys.exit(3)"),
        ("raise SystemExit('bye')", "called sys.exit('bye')"),
        ("import os\nos._exit(7)", "ended its process with exit status 7"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "killed its process (SIGKILL)"),
    ],
    ids=["exit-0", "exit-3", "systemexit-msg", "os-exit-7", "sigkill"],
)
def test_a_target_that_exits_or_dies_at_import_is_a_usage_error(tmp_path, body, words, monkeypatch, capsys):
    # In this process (the import is probed in a child of its own, which is what is tested).
    from subclass_kit.cli import main

    (tmp_path / "quitter.py").write_text(body + "\nX = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["check", "quitter:X", "--backend", "eager"]) == 2
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("subclass-kit: error: importing quitter "), err
    assert words in err[0] and ("import cleanly" in err[0] or "exit at import" in err[0]), err[0]
    assert out == "" and "quitter" not in sys.modules


def test_opinfo_prints_coverage_and_writes_it_to_json_and_markdown(runs, cli_root):
    r, bad, typo = runs["opinfo"], runs["ops without opinfo"], runs["opinfo typo"]
    js, md = cli_root / "opinfo.json", cli_root / "opinfo.md"
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and "opinfo[neg]" in r.stdout and "opinfo[mm]" in r.stdout
    assert "OpInfo coverage:\n  TwoTensor: 2 of 2 ops pass" in r.stdout and "pass: mm, neg" in r.stdout
    doc = json.loads(js.read_text())
    assert doc["reports"][0]["opinfo"]["by_outcome"]["pass"] == ["mm", "neg"]
    assert "| pass | 2 | mm, neg |" in md.read_text()
    assert bad.returncode == 2 and "--ops selects OpInfo ops and needs --opinfo" in bad.stderr
    assert typo.returncode == 2 and "no OpInfo named 'nge'" in typo.stderr, typo.stderr


def test_opinfo_with_no_target_reports_coverage_for_every_exemplar(runs):
    from subclass_kit.cli import builtin_targets

    names = [obj.__name__ for _, obj in builtin_targets()]
    assert "ShardedTensor" in names  # distributed exemplars are swept too (from_plain on MeshRef.local())
    r = runs["opinfo no target"]
    assert r.returncode == 0, r.stdout + r.stderr
    coverage = r.stdout.split("OpInfo coverage:\n", 1)[1]
    for name in names:
        if name == "JaggedTensor":
            # (B, max_len, D) only: neg's and mm's OpInfo samples are 2-D, refused by from_plain.
            assert f"\n  {name}: 0 of 2 ops pass (0 wrong, 0 error, 0 timeout, 0 unsupported, 2 skip)" in "\n" + coverage
            continue
        assert f"\n  {name}: 2 of 2 ops pass" in "\n" + coverage, (name, coverage)
