"""Load AOTInductor packages in a process that has never imported subclass_kit.

Imports torch only: a package must run where the kit is not installed. Used as a script
(``python _reload.py CASES.json``, prints a JSON report) and as a task for fresh gloo ranks
(:func:`load_and_compare`), where the packages' collectives need a process group.
"""

from __future__ import annotations

import json
import sys
import time

import torch


def load_and_compare(cases: list) -> dict:
    """For each case ``{"name", "package", "data"}`` (``data``: a torch.save'd list of
    ``(input, expected)`` pairs): load, run every input, report the largest error and the
    load and first-call times."""
    import torch._inductor

    report = {}
    for case in cases:
        t0 = time.perf_counter()
        run = torch._inductor.aoti_load_package(case["package"])
        t1 = time.perf_counter()
        pairs = torch.load(case["data"], weights_only=True)
        errors, first = [], None
        for x, expected in pairs:
            t2 = time.perf_counter()
            out = run(x)
            if first is None:
                first = time.perf_counter() - t2
            assert type(out) is torch.Tensor, type(out)
            assert out.shape == expected.shape, (case["name"], out.shape, expected.shape)
            errors.append((out - expected).abs().max().item())
        report[case["name"]] = {"max_error": max(errors), "load_s": t1 - t0, "first_call_s": first}
    report["kit_imported"] = any(m == "subclass_kit" or m.startswith("subclass_kit.") for m in sys.modules)
    return report


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(load_and_compare(json.load(f))))
