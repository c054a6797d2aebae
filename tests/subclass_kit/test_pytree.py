"""The pytree facade, every test run on both implementations (optree and torch's Python pytree).

Both follow torch's pytree semantics, so switching never changes meaning: None is a leaf,
dicts keep insertion order, torch's node types (torch.Size) are nodes, and tensors (wrapped or
not) are leaves.
"""

from __future__ import annotations

import collections

import pytest
import torch

from subclass_kit import pytree
from subclass_kit.examples import BlockScaled, TwoTensor

NT = collections.namedtuple("NT", "x y")

@pytest.fixture(params=["optree", "python"])
def impl(request):
    with pytree.using(request.param):
        yield request.param
    assert pytree.current() == "optree"


def _tree():
    x = TwoTensor(torch.ones(2), torch.zeros(2))
    return {"a": [1, (2, 3)], "b": NT(x=torch.arange(3.0), y=x), "c": 4}


def test_current_reports_the_selected_implementation(impl):
    assert pytree.current() == impl


def test_tree_map_and_tensors_wrapped_or_not_are_leaves(impl):
    t = _tree()
    out = pytree.tree_map(lambda v: ("leaf", type(v).__name__), t)
    assert out == {
        "a": [("leaf", "int"), (("leaf", "int"), ("leaf", "int"))],
        "b": NT(x=("leaf", "Tensor"), y=("leaf", "TwoTensor")),
        "c": ("leaf", "int"),
    }
    assert type(out["b"]) is NT


def test_tree_map_over_several_trees(impl):
    assert pytree.tree_map(lambda a, b: a + b, [1, (2, 3)], [10, (20, 30)]) == [11, (22, 33)]


def test_tree_map_only_touches_instances(impl):
    t = _tree()
    out = pytree.tree_map_only(TwoTensor, lambda x: x.a.sum().item(), t)
    assert out["b"].y == 2.0 and torch.equal(out["b"].x, torch.arange(3.0)) and out["a"] == [1, (2, 3)]
    out = pytree.tree_map_only((int,), lambda v: -v, t)
    assert out["a"] == [-1, (-2, -3)] and out["c"] == -4 and out["b"].y is t["b"].y


def test_flatten_unflatten_round_trip(impl):
    t = _tree()
    leaves, spec = pytree.tree_flatten(t)
    assert len(leaves) == 6
    assert sorted(v for v in leaves if isinstance(v, int)) == [1, 2, 3, 4]
    assert any(v is t["b"].y for v in leaves)
    back = pytree.tree_unflatten(leaves, spec)
    assert back["a"] == [1, (2, 3)] and back["b"].y is t["b"].y and back["c"] == 4


def test_a_spec_unflattens_whatever_implementation_is_current(impl):
    other = "python" if impl == "optree" else "optree"
    with pytree.using(other):
        leaves, spec = pytree.tree_flatten([1, {"k": 2}])
    assert pytree.tree_unflatten([5, 6], spec) == [5, {"k": 6}]


def test_flatten_of_blockscaled_keeps_it_whole(impl):
    x = BlockScaled.__samples__()[0]
    assert pytree.tree_leaves([x]) == [x]


def test_none_is_a_leaf_as_in_torch(impl):
    assert pytree.tree_leaves([1, None, (None, 2)]) == [1, None, None, 2]
    assert pytree.tree_map(lambda v: "N" if v is None else v * 10, [1, None]) == [10, "N"]
    leaves, spec = pytree.tree_flatten({"k": None})
    assert leaves == [None] and pytree.tree_unflatten(["x"], spec) == {"k": "x"}


def test_dicts_keep_insertion_order(impl):
    tree = {"b": 1, "a": (2, 3)}
    assert pytree.tree_leaves(tree) == [1, 2, 3]
    assert list(pytree.tree_map(lambda v: v, tree)) == ["b", "a"]


_TREES = [
    [1, None, (2, {"z": 3, "y": None})],
    {"b": NT(x=1, y=[2, None]), "a": ()},
    (torch.Size([2, 3]), [4]),
    {"t": torch.ones(1), "n": None},
]


@pytest.mark.parametrize("tree", _TREES, ids=["nested-none", "namedtuple-dict", "size", "tensor"])
def test_both_implementations_agree_with_torch_pytree(tree):
    import torch.utils._pytree as torch_pytree

    expected = torch_pytree.tree_leaves(tree)
    for name in ("optree", "python"):
        with pytree.using(name):
            leaves, spec = pytree.tree_flatten(tree)
            assert len(leaves) == len(expected) and all(a is b or a == b for a, b in zip(leaves, expected)), name
            assert pytree.tree_leaves(tree) == leaves
            rebuilt = pytree.tree_unflatten(leaves, spec)
            # Same structure back (torch.Size comes back as a tuple in torch's pytree too).
            assert torch_pytree.tree_structure(rebuilt) == torch_pytree.tree_structure(
                torch_pytree.tree_unflatten(expected, torch_pytree.tree_structure(tree))
            ), name
            assert pytree.tree_leaves(rebuilt) == leaves


def test_use_rejects_unknown_and_using_restores_on_error():
    with pytest.raises(ValueError, match="optree"):
        pytree.use("jax")
    with pytest.raises(RuntimeError):
        with pytree.using("python"):
            assert pytree.current() == "python"
            raise RuntimeError
    assert pytree.current() == "optree"
