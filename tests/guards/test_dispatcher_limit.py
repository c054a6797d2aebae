"""GuardedDispatcher (issue 21 item 5): an entry limit like dynamo's, a named warning and
an eviction or fallback policy at the limit, and entries found by key rather than a scan,
always the same entry a scan would choose."""

import random

import pytest
import torch

import guards
from guards.guardset import GuardSet
from subclass_kit import WrapperTensor, inner, meta
from subclass_kit.examples import BlockScaled, TwoTensor


class Tagged(WrapperTensor):
    a: torch.Tensor = inner()
    tag: int = meta(default=0)


def _tagging_compile(made):
    """A compile_fn whose artifacts say which compile made them."""

    def compile_fn(*inputs):
        i = len(made)
        made.append(inputs)
        return lambda *xs: i

    return compile_fn


def _scan(d, *inputs):
    """What the dispatcher did before the index: the oldest entry that accepts."""
    for e in d.entries:
        if e.guards.check(inputs):
            return e
    return None


def test_default_limit_is_dynamos_recompile_limit():
    assert guards.GuardedDispatcher(lambda x: x).limit == torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=3):
        assert guards.GuardedDispatcher(lambda x: x).limit == 3
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="limit must be a positive int"):
            guards.GuardedDispatcher(lambda x: x, limit=bad)


def test_at_the_limit_it_warns_once_and_evicts_the_least_recently_used():
    made = []
    d = guards.GuardedDispatcher(_tagging_compile(made), limit=2)
    base = torch.ones(3)
    t = {k: Tagged(base, tag=k) for k in range(1, 6)}
    assert d(t[1]) == 0 and d(t[2]) == 1 and d(t[1]) == 0  # tag 2 is now the least recently used
    with pytest.warns(guards.DispatcherLimitWarning, match="limit of 2 artifacts; evicting the least recently used"):
        assert d(t[3]) == 2
    assert len(d) == 2 and d.evictions == 1
    assert [e.guards.check((t[1],)) for e in d.entries] == [True, False]  # tag 1 was kept
    assert d(t[1]) == 0  # still served by its artifact
    # Further evictions do not warn again (pytest turns our warnings into errors).
    assert d(t[2]) == 3  # recompiled: its artifact was evicted
    assert len(d) == 2 and d.evictions == 2 and len(made) == 4
    # Whatever was evicted, every call is served by an artifact built for inputs like it.
    for k in (1, 2, 3, 4, 5, 2):
        i = d(t[k])
        assert made[i][0].tag == k


def test_at_the_limit_a_fallback_serves_without_compiling():
    made, fell = [], []
    d = guards.GuardedDispatcher(_tagging_compile(made), limit=2, fallback=lambda x: fell.append(x.tag) or "eager")
    base = torch.ones(3)
    d(Tagged(base, tag=1)), d(Tagged(base, tag=2))
    with pytest.warns(guards.DispatcherLimitWarning, match="fallback"):
        assert d(Tagged(base, tag=3)) == "eager"
    assert d(Tagged(base, tag=4)) == "eager" and d(Tagged(base, tag=1)) == 0
    assert len(made) == 2 and len(d) == 2 and fell == [3, 4] and d.fallback_calls == 2


def test_the_warning_names_the_fix():
    d = guards.GuardedDispatcher(lambda x: (lambda x: x), limit=1)
    d(torch.ones(2))
    with pytest.warns(guards.DispatcherLimitWarning) as w:
        d(torch.ones(3))
    msg = str(w[0].message)
    assert "L['x'].size()[0]: expected 2, got 3" in msg and "limit=" in msg and "dynamic" in msg


def _inputs(rng):
    """A mix that exercises several key schemas and, within one key, several shape entries."""
    rows = rng.choice([2, 3, 4, 5])
    kind = rng.choice(["plain", "plain_dyn", "two", "block", "tagged", "tuple"])
    if kind == "plain":
        return (torch.ones(rows, 3, dtype=rng.choice([torch.float32, torch.float64])),)
    if kind == "plain_dyn":
        x = torch.ones(rows, 3)
        torch._dynamo.mark_dynamic(x, 0)
        return (x,)
    if kind == "two":
        return (TwoTensor(torch.ones(rows, 3), torch.ones(rows, 3)),)
    if kind == "block":
        return (BlockScaled.from_float(torch.ones(8 * rows, 4), block=rng.choice([4, 8, 16])),)
    if kind == "tagged":
        return (Tagged(torch.ones(rows), tag=rng.choice([0, 1, 2])),)
    return ((torch.ones(rows), rng.choice([1, 2, "a", None, 2.5])),)


def test_key_lookup_chooses_what_a_scan_chooses_and_never_a_wrong_artifact():
    rng = random.Random(0)
    made = []
    d = guards.GuardedDispatcher(_tagging_compile(made), limit=1000)
    for _ in range(120):
        inputs = _inputs(rng)
        assert d.lookup(*inputs) is _scan(d, *inputs)
        i = d(*inputs)
        # The artifact that served was built for inputs its guards accept, and accepts these.
        (e,) = [e for e in d.entries if e.artifact(*inputs) == i]
        assert e.guards.check(inputs) and e.guards.check(made[i])
    assert len(d) > 20 and len({type(x[0]) for x in made}) > 3  # several schemas were exercised
    for _ in range(200):
        inputs = _inputs(rng)
        assert d.lookup(*inputs) is _scan(d, *inputs)


def test_serving_the_newest_of_200_entries_checks_one_guard_set(monkeypatch):
    """Found by key: the newest of 200 entries that differ in a meta value costs one full
    check, as with one entry (the linear scan ran 200)."""
    d = guards.GuardedDispatcher(lambda x: (lambda x: x), limit=201)
    base = torch.ones(4, 3)
    for tag in range(200):
        d(Tagged(base, tag=tag))
    calls = []
    real = GuardSet.check
    monkeypatch.setattr(GuardSet, "check", lambda self, v: calls.append(1) or real(self, v))
    newest = Tagged(base, tag=199)
    assert d.lookup(newest) is d.entries[-1] and len(calls) == 1
    calls.clear()
    d(Tagged(torch.ones(5, 3), tag=199))  # same key, other shape: checked, refused, compiled
    assert len(calls) == 1 and len(d) == 201
