"""Deploying on 2 gloo ranks: per-rank AOTInductor packages of a tensor-parallel MLP
(ShardedTensor parameters, ColwiseParallel + RowwiseParallel) and of a module that calls
``subclass_kit.collectives.all_reduce``, each with the batch dim dynamic.

Each rank exports its own program, strict and non-strict, and compares both with eager
(cheap); the non-strict programs (torch.export's default) are compiled and run; then a
NEW 2-rank gloo world -- fresh interpreters that import torch only -- loads the packages
(the collectives in them run on the new world's default group) and compares again. Slow:
two compiles per rank, ranks compiling concurrently.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import warnings

import pytest

from kit_helpers.harness import RankFailure, world

from deploy import _tasks

pytestmark = [pytest.mark.slow, pytest.mark.dist]

TIMEOUT = 400.0
RELOAD = pathlib.Path(__file__).with_name("_reload.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FreshRanksHangWarning(UserWarning):
    """A world of ranks hung in torch's gloo deadlock and was killed; it was started once more."""


# A run takes 20-60 s. Past this a rank is stuck: torch 2.13's gloo can deadlock between a
# packaged collective and its worker (see _reload.load_and_compare); each rank dumps its
# threads' stacks to stderr (faulthandler) before it is killed, so the warning shows where.
RANK_TIMEOUT = 200.0


def _fresh_world(spec, tmp_path) -> list:
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(RELOAD), "--rank", str(r), str(len(json.loads(spec.read_text()))), str(port), str(spec)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
            env=dict(os.environ, RELOAD_DUMP_AFTER=str(RANK_TIMEOUT - 20)),
        )
        for r in range(len(json.loads(spec.read_text())))
    ]
    outs, hung = [], False
    try:
        for p in procs:
            try:
                outs.append(p.communicate(timeout=RANK_TIMEOUT))
            except subprocess.TimeoutExpired:
                hung = True
                p.kill()
                outs.append(p.communicate())
    finally:
        for p in procs:  # always reaped
            if p.poll() is None:
                p.kill()
            p.wait()
    return procs, outs, hung


def fresh_ranks(cases: list, tmp_path) -> list:
    """Run ``_reload.py --rank`` as a gloo world of new interpreters; their reports.

    A world that hangs (torch's deadlock, not the kit's: these ranks never import it) is
    reported with FreshRanksHangWarning and started once more; any other failure, or a
    second hang, fails."""
    spec = tmp_path / "rank_cases.json"
    spec.write_text(json.dumps(cases))
    for attempt in (1, 2):
        procs, outs, hung = _fresh_world(spec, tmp_path)
        if hung and attempt == 1:
            tails = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{err[-3000:]}" for r, (p, (_, err)) in enumerate(zip(procs, outs)))
            warnings.warn(FreshRanksHangWarning(f"a fresh torch-only world hung; starting it once more:\n{tails}"))
            continue
        break
    for r, (p, (_, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{err[-3000:]}"
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def _built_packages(tmp_path) -> list:
    """``build_packages`` on the shared 2-rank world. A rank stuck in a package's call while
    its peer's collective timed out is torch 2.13's gloo deadlock (see _reload.load_and_compare;
    a loaded machine makes it likelier): reported with FreshRanksHangWarning and run once
    more on a new world; any other failure, or a second hang, fails."""
    for attempt in (1, 2):
        try:
            return world(2).run(_tasks.build_packages, str(tmp_path), timeout=TIMEOUT)
        except RankFailure as e:
            if attempt == 2 or "had not answered when the task timed out" not in str(e):
                raise
            warnings.warn(FreshRanksHangWarning(f"the 2-rank world hung in a package's call; running it once more:\n{e}"))
    raise AssertionError("unreachable")


def test_tp_and_collectives_packages_per_rank(tmp_path):
    reports = _built_packages(tmp_path)
    for r in reports:
        for mode in ("strict", "nonstrict"):
            assert r[f"tp_{mode}_export_error"] <= 1e-5, r
            assert r[f"ar_{mode}_export_error"] <= 1e-5, r
            assert any("all_reduce" in t for t in r[f"ar_{mode}_targets"]), r
            assert any("wait_tensor" in t for t in r[f"ar_{mode}_targets"]), r
        assert r["tp"]["in_process_error"] <= 1e-5 and r["ar"]["in_process_error"] <= 1e-5, r
    # rank i loads the packages rank i built, in a fresh interpreter (exec'd, not forked)
    reloaded = fresh_ranks([[r["tp"]["case"], r["ar"]["case"]] for r in reports], tmp_path)
    for rank, rep in enumerate(reloaded):
        assert rep.pop("kit_imported") is False
        assert sorted(rep) == ["all_reduce", "tp_mlp"]
        for name, r in rep.items():
            assert r["max_error"] <= 1e-5, (rank, name, r)
    print("dist deploy figures:", reports, reloaded)
