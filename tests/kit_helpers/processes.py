"""Fresh interpreters for the tests: ``python -c code`` from the repo root, every child reaped."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def _child_env(env: dict | None) -> dict:
    # The repo (the packages) and tests/ (kit_helpers and the tests' own modules), as pytest
    # itself sees them through ``pythonpath``.
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    return full_env


def run_pythons(jobs, *, timeout: float = 300) -> list:
    """Run ``python -c code`` for each ``(code, env)`` in fresh interpreters, concurrently
    (``run_all``). Returns the stdouts; raises with the output of any child that failed.
    Every child is reaped."""
    done = run_all([([sys.executable, "-c", code], _child_env(env), REPO) for code, env in jobs], timeout=timeout)
    for p in done:
        if p.returncode != 0:
            raise AssertionError(f"subprocess failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return [p.stdout for p in done]


def run_python(code: str, *, env: dict | None = None, timeout: float = 300) -> str:
    """Run ``python -c code`` in a fresh interpreter from the repo root; return its stdout."""
    return run_pythons([(code, env)], timeout=timeout)[0]


def cli_command() -> list:
    """The ``subclass-kit`` console script when installed, else ``python -m subclass_kit.cli``."""
    exe = shutil.which("subclass-kit")
    return [exe] if exe else [sys.executable, "-m", "subclass_kit.cli"]


def cli_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_cli(*args, cwd=TESTS, timeout=600) -> subprocess.CompletedProcess:
    """``subclass-kit *args`` in a subprocess, from tests/ (where ``broken_subclasses`` is)."""
    return subprocess.run(
        [*cli_command(), *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout
    )


def run_all(commands, *, timeout: float = 600, jobs: int | None = None) -> list:
    """Run each ``(argv, env, cwd)`` in ``commands`` as its own process, all started at once,
    or at most ``jobs`` at a time (starting interpreters dominates; the machine has cores to
    overlap it, and memory for a few at once). Returns their CompletedProcesses in order;
    every child is reaped (one past ``timeout`` is killed and says so in its stderr, for its
    own test to report)."""
    if jobs is not None and jobs < len(commands):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(lambda c: run_all([c], timeout=timeout)[0], commands))
    procs = [
        subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for argv, env, cwd in commands
    ]
    done = []
    try:
        for p in procs:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                err += f"\n(killed after {timeout}s)"
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def run_clis(*commands, cwd=TESTS, timeout=600, jobs: int | None = None) -> list:
    """``subclass-kit *args`` for each ``args`` in ``commands``, each in its own process as
    ``run_cli`` runs it, all started at once or ``jobs`` at a time (``run_all``). A command
    is ``args``, or ``(args, cwd)`` to run it from a folder of its own."""
    return run_all([([*cli_command(), *c[0]], cli_env(), c[1]) if type(c) is tuple else ([*cli_command(), *c], cli_env(), cwd)
                    for c in commands], timeout=timeout, jobs=jobs)
