"""Identity checks: the class can be found again by name, and its cache hash is the same
in another process.

AOTAutograd's cache pickles a wrapper class by reference (module + qualified name): a class
defined inside a function cannot be pickled, so every graph that takes it bypasses the
cache. Its cache key takes ``_stable_hash_for_caching()`` (or, without it, a pickle of the
ctx); a hash built from ``hash()``, ``id()`` or an address-bearing repr differs in every
process, so a warm cache never hits. The check sends the samples to a fresh interpreter
with another ``PYTHONHASHSEED`` and compares.

Two differences are torch's, not the class's, and reported as such: torch pickles dtypes and
memory formats under the first module in ``sys.modules`` holding them (so its default hash
depends on which module imported torch first -- the same on every restart of one program;
compared again with those rendered canonically), and a jagged dim's nested int pickles with
its per-process id.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from typing import Any

from . import _hashing
from ._check import Check, Fail, Skip, selected
from ._subject import describe, flatten

__all__ = ["plan"]

CHILD_TIMEOUT = 120.0


def plan(run) -> list:
    return [
        Check("identity.importable", _importable, ("protocol.flatten",)),
        Check(
            "identity.stable_hash",
            _stable_hash,
            ("protocol.flatten", "identity.importable", "ctx.picklable"),
            late=True,
        ),
    ]


def start(runs) -> None:
    """Send every subject's samples to ONE fresh interpreter now; rows collect the answer
    at the end of their subject, so the child's start-up overlaps the other checks."""

    sendable: list[Any] = []
    for run in runs:
        state = run.state.setdefault("identity", {})
        if not selected("identity.stable_hash", run.only):
            continue
        cls = run.cls
        if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
            state["skip"] = f"{cls.__qualname__} cannot be imported by another process"
            continue
        try:
            enc = pickle.dumps([_hashing.encode(x) for x in run.samples])
        except _hashing.Unsendable as e:
            state["skip"] = str(e)
            continue
        except Exception as e:
            state["skip"] = f"the samples cannot be pickled for another process ({type(e).__name__}: {str(e)[:120]})"
            continue
        state["index"] = len(sendable)
        sendable.append((run, enc))
    if not sendable:
        return
    job = _Job(pickle.dumps([enc for _, enc in sendable]))
    for run, _ in sendable:
        run.state["identity"]["job"] = job
    sendable[-1][0].state.setdefault("cleanups", []).append(job.close)


class _Job:
    """One child process hashing the samples of several subjects."""

    def __init__(self, payload: bytes):
        self.t0 = time.perf_counter()
        self.payload = payload
        self.answer = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "subclass_kit.testing._hash_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(),
        )

    def result(self):
        """The child's answer (a list per subject), or raises Skip/Fail."""
        if self.answer is None:
            try:
                out, err = self.proc.communicate(self.payload, timeout=CHILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.close()
                raise Skip(f"the child process did not answer within {CHILD_TIMEOUT:.0f}s") from None
            if self.proc.returncode != 0:
                tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                self.answer = ("error", tail[0])
            else:
                self.answer = ("ok", json.loads(out.decode()))
            self.seconds = time.perf_counter() - self.t0
        return self.answer

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def _importable(run):
    cls = run.cls
    mod, qual = cls.__module__, cls.__qualname__
    if "<locals>" in qual:
        raise Fail(
            f"{qual} is defined inside a function, so it cannot be imported by its qualified "
            "name: AOTAutograd's cache cannot pickle it and is bypassed for every graph that "
            "takes it (and torch.save/pickle of its instances fail)",
            f"move class {cls.__name__} to module level",
        )
    try:
        found = _hashing.import_qualified(mod, qual)
    except Exception as e:
        raise Fail(
            f"{mod}:{qual} cannot be imported ({type(e).__name__}: {e}); caches and pickles "
            "find the class by this name",
            "define the class at module level under the name it was created with",
        ) from None
    if found is not cls:
        raise Fail(
            f"{mod}:{qual} names a different object than the class being checked (the class "
            "was redefined or renamed after creation)",
            "keep one definition per name; do not rebind the class name",
        )
    if mod == "__main__":
        return "defined in __main__: other processes (cache readers, workers) cannot import it"
    return ""


def _child_env() -> dict:
    env = dict(os.environ)
    mine = os.environ.get("PYTHONHASHSEED")
    env["PYTHONHASHSEED"] = "271828" if mine != "271828" else "314159"
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _stable_hash(run):
    state = run.state.get("identity", {})
    if "skip" in state:
        raise Skip(state["skip"])
    if "job" not in state:
        raise Skip("the samples were not sent to a child process")
    kind, answer = state["job"].result()
    if kind == "error":
        raise Fail(
            f"the fresh process checking the hashes crashed: {answer}",
            "run `python -m subclass_kit.testing._hash_child` by hand to see the traceback",
        )
    theirs = answer[state["index"]]
    if isinstance(theirs, dict) and "load_error" in theirs:
        err = theirs["load_error"]
        if "import" in err.lower() or "attribute" in err.lower() and "module" in err.lower():
            fix = "make the class and its ctx importable at module level, under the names they carry"
        else:
            fix = "make the samples' inner tensors and ctx unpickle in a fresh process"
        raise Fail(f"a fresh process could not unpickle the samples of {run.name}: {err}", fix)
    has_own = hasattr(run.cls, "_stable_hash_for_caching")
    what = "_stable_hash_for_caching()" if has_own else "torch's default subclass hash (a pickle of the outer size, ctx and inner tensors' metadata)"
    mine = [_hashing.stable_hash(x) for x in run.samples]
    import_order = []
    for i, (x, a, b) in enumerate(zip(run.samples, mine, theirs)):
        if "error" in b:
            raise Fail(
                f"computing {what} for sample {i} ({describe(x)}) in a fresh process raised {b['error']}",
                "make the hash depend only on the class, the ctx values and the outer metadata",
            )
        if a != b["hash"] and not has_own and _hashing.stable_hash(x, canonical=True) == b.get("canonical"):
            # torch's own pickling of dtypes / memory formats names the first module in
            # sys.modules that holds them: this process imported torch in another order
            # than a fresh one. Not the class's doing, and a restart of the same program
            # computes the same hash.
            import_order.append(i)
            continue
        if a != b["hash"]:
            fix = (
                "build it from canonical data only: e.g. sha256 of json.dumps([class qualname, ctx "
                "values, sizes], sort_keys=True); never hash(), id() or a repr with an address"
            )
            if not has_own:
                fix = "define _stable_hash_for_caching(self) -> str that way, or make the ctx pickle deterministically (no sets of strings)"
            ragged = [d for d, s in enumerate(x.shape) if not isinstance(s, int)]
            if ragged and not has_own:
                # torch's default hash pickles the outer size; a jagged dim is a nested int
                # whose node carries a process-wide counter (j0, j1, ...), not a value
                raise Fail(
                    f"{what} of sample {i} ({describe(x)}) pickles the outer size, and dim {ragged[0]} is "
                    f"a nested int ({x.shape[ragged[0]]} here) numbered by a per-process counter of "
                    "offsets tensors, not by value: the hash differs across processes and even between "
                    "two equal tensors built one after the other in one process, so AOTAutograd's "
                    "cache misses for any graph that holds one as a constant",
                    "define _stable_hash_for_caching(self) -> str from the class, the ctx, the inner "
                    "tensors' metadata and the outer size with the nested int rendered by position "
                    "(e.g. 'j'), not by its id",
                )
            raise Fail(
                f"{what} of sample {i} ({describe(x)}) differs across processes ({a[:16]}... here, "
                f"{b['hash'][:16]}... in a process with another PYTHONHASHSEED), so AOTAutograd's "
                "cache never hits after a restart",
                fix,
            )
    by_hash = {}
    for i, (x, h) in enumerate(zip(run.samples, mine)):
        ctx = flatten(x)[1]
        key = (h, tuple(x.shape), x.dtype, x.requires_grad)
        if key in by_hash:
            j, other = by_hash[key]
            if not _eq(other, ctx):
                raise Fail(
                    f"samples {j} and {i} have different ctx ({other!r:.60} vs {ctx!r:.60}) but the same "
                    f"{what}, so the cache could serve one's graph to the other",
                    "include every ctx value in the hash",
                )
        by_hash[key] = (i, ctx)
    note = f"same in a fresh process (answered after {state['job'].seconds:.1f}s)"
    if not has_own:
        note += " (torch's default hash: the class has no _stable_hash_for_caching)"
    if import_order:
        note += (
            f"; for sample(s) {', '.join(map(str, import_order))} torch's default hash differed only "
            "because this process imported torch in another module order (torch pickles "
            "torch.contiguous_format and dtypes under the first module in sys.modules that holds "
            "them): the ctx hashes the same, and a restart of the same program gets the same key"
        )
    return note


def _eq(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False
