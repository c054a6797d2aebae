"""PyTorch's own tensor-parallel tests (torch's test/distributed/tensor/parallel/
test_tp_style.py, test_parallelize_api.py, test_tp_examples.py), ported to the kit on 2
real gloo ranks: see _tp_upstream_tasks for the ports and how they map torch's names."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _tp_upstream_tasks

pytestmark = pytest.mark.dist

# Ports that fail today, with a phrase of their error; this list may only shrink.
PENDING: dict = {}


@pytest.mark.parametrize("group", ["test_tp_style", "test_parallelize_api", "test_tp_examples"])
def test_upstream_tp_ports(group):
    results = world(2).run(_tp_upstream_tasks.run, group, timeout=600)
    assert results[0].keys() == results[1].keys() == _tp_upstream_tasks.ports(group).keys()
    failed = {name: r[name] for r in results for name in r if r[name] != "ok"}
    unexpected = {n: e for n, e in failed.items() if n not in PENDING or PENDING[n] not in e}
    assert not unexpected, "\n".join(f"{n}: {e}" for n, e in unexpected.items())
