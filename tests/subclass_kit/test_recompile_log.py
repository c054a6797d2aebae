"""Logging: with TORCH_LOGS=recompiles, a recompile caused by a kit subclass's meta field
shows the field, the old and the new value next to dynamo's opaque ``___check_metadata_``
reason; the kit's other log points (fallbacks, GuardedDispatcher) go to package loggers."""

import logging
import os
import re
import sys
import textwrap

import pytest
import torch

import guards
from subclass_kit import WrapperTensor, fallbacks, inner, meta, recompiles
from subclass_kit.examples import BlockScaled

from kit_helpers.processes import run_all

SCRIPT = textwrap.dedent("""
    import torch
    from subclass_kit import WrapperTensor, inner, meta, fallbacks

    class Tagged(WrapperTensor):
        a: torch.Tensor = inner()
        tag: str = meta(default="x")
        __fallback__ = fallbacks.map_inner

    def f(x):
        return x * 2

    cf = torch.compile(f, backend="eager")
    cf(Tagged(torch.ones(3), tag="old-tag"))
    cf(Tagged(torch.ones(3), tag="new-tag"))
    print("done")
""")


def _env(torch_logs):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_LOGS"}
    if torch_logs is not None:
        env["TORCH_LOGS"] = torch_logs
    return env


@pytest.fixture(scope="module")
def runs() -> dict:
    # The script in a fresh interpreter with and without TORCH_LOGS, started together.
    settings = ("recompiles", None)
    done = run_all([([sys.executable, "-c", SCRIPT], _env(s), None) for s in settings], timeout=300)
    return dict(zip(settings, done))


def test_torch_logs_recompiles_shows_field_old_and_new(runs):
    r = runs["recompiles"]
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    dynamo = [ln for ln in r.stderr.splitlines() if "___check_metadata_" in ln and "subclass_kit:" not in ln]
    ours = [ln for ln in r.stderr.splitlines() if "subclass_kit:" in ln]
    assert dynamo, r.stderr  # dynamo's own, opaque reason is there ...
    assert len(ours) == 1, r.stderr  # ... and the kit's readable one right with it
    assert re.search(r"\.tag: expected 'old-tag', got 'new-tag'", ours[0]), ours[0]
    assert "[__recompiles]" in ours[0]  # appended to dynamo's message, same stream and prefix


def test_nothing_without_torch_logs(runs):
    r = runs[None]
    assert r.returncode == 0 and "subclass_kit:" not in r.stderr and "___check_metadata_" not in r.stderr


class Tagged(WrapperTensor):
    a: torch.Tensor = inner()
    tag: str = meta(default="x")
    __fallback__ = fallbacks.map_inner


@pytest.fixture
def recompile_logs():
    torch._logging.set_logs(recompiles=True)
    try:
        yield
    finally:
        torch._logging.set_logs()


def test_every_failed_entry_is_explained_in_process(recompile_logs, caplog):
    def f(y, x):
        return x * 2 + y

    cf = torch.compile(f, backend="eager")
    with caplog.at_level(logging.INFO, logger="subclass_kit.recompiles"):
        for tag in ("a", "b", "c"):
            cf(torch.ones(3), Tagged(torch.ones(3), tag=tag))
    lines = [r.getMessage() for r in caplog.records if r.name == "subclass_kit.recompiles"]
    # Second call: entry 0/0 (tag 'a') refuses 'b'. Third: 0/1 ('b') and 0/0 ('a') refuse 'c'.
    pairs = [re.search(r"(\d/\d): L\['x'\]\S*\.tag: expected '(\w)', got '(\w)'", ln).groups() for ln in lines]
    assert sorted(pairs) == sorted([("0/0", "a", "b"), ("0/1", "b", "c"), ("0/0", "a", "c")]), lines


def test_reasons_agree_with_explain_recompiles(recompile_logs, caplog):
    """The live log and guards.explain_recompiles translate the same change the same way."""
    def f(x):
        return x + 1

    inputs = [(Tagged(torch.ones(2), tag="p"),), (Tagged(torch.ones(2), tag="q"),)]
    with caplog.at_level(logging.INFO, logger="subclass_kit.recompiles"):
        report = guards.explain_recompiles(f, inputs)
    live = [r.getMessage().removeprefix("recompile: ") for r in caplog.records if r.name == "subclass_kit.recompiles"]
    strip = lambda s: re.sub(r" \[dynamo: .*\]$", "", s)  # noqa: E731 - the checker id differs per compile
    assert [strip(s) for s in live] == [strip(s) for s in report.calls[1].reasons]


def test_readable_reasons_outside_a_recompile_is_empty():
    assert recompiles.readable_reasons() == []


class FreshBlockScaled(BlockScaled):
    """No op resolved yet: its first add goes through the lookup (and its log line)."""


def test_fallback_and_dispatcher_log_points(caplog):
    x = FreshBlockScaled(torch.ones(64, 8, dtype=torch.int8), torch.full((2, 1), 0.5), dtype=torch.float32)
    with caplog.at_level(logging.DEBUG, logger="subclass_kit.dispatch"):
        x + 1
        x + 2
    fb = [r.getMessage() for r in caplog.records if r.name == "subclass_kit.dispatch"]
    assert fb == ["FreshBlockScaled has no handler for aten.add.Tensor; it goes to __fallback__ (to_plain)"]

    d = guards.GuardedDispatcher(lambda x: (lambda x: x + 1))
    with caplog.at_level(logging.INFO, logger="guards.dispatcher"):
        d(torch.ones(2))
        d(torch.ones(3))
    msgs = [r.getMessage() for r in caplog.records if r.name == "guards.dispatcher"]
    assert msgs == ["GuardedDispatcher: compiling artifact 1; " + d.explain(torch.ones(3))[0]]
