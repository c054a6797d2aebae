"""Field declaration: what ``__init_subclass__`` accepts, derives and refuses at class definition."""

from __future__ import annotations

import textwrap
import warnings
from typing import ClassVar

import pytest
import torch
from expecttest import assert_expected_inline

from subclass_kit import (
    FieldDeclarationError,
    LocalClassWarning,
    SubclassKitError,
    WrapperTensor,
    fallbacks,
    inner,
    meta,
)
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor


def _define(source: str) -> dict:
    """Execute a class definition at "module level" (its qualname has no <locals>)."""
    ns = {"torch": torch, "WrapperTensor": WrapperTensor, "inner": inner, "meta": meta, "ClassVar": ClassVar}
    exec(textwrap.dedent(source), ns)
    return ns


def _declaration_error(source: str) -> str:
    with pytest.raises(FieldDeclarationError) as info:
        _define(source)
    # Catchable as the builtin too (STYLE: errors subclass the matching builtin).
    assert isinstance(info.value, TypeError) and isinstance(info.value, SubclassKitError)
    return str(info.value)


# ---- module-level throwaway classes --------------------------------------------------------


class Base2(WrapperTensor):
    payload: torch.Tensor = inner()
    extra: torch.Tensor = inner(optional=True)
    scale_hint: float = meta(default=1.0)
    kind: str = meta()
    __fallback__ = fallbacks.map_inner


class Child2(Base2):
    more: torch.Tensor = inner(optional=True)
    level: int = meta(default=3)


class AbstractBase(WrapperTensor, abstract=True):
    tag: str = meta(default="abs")


class Concrete(AbstractBase):
    payload: torch.Tensor = inner()


class WithClassVar(WrapperTensor):
    payload: torch.Tensor = inner()
    registry: ClassVar[dict] = {}


# ---- the spec ------------------------------------------------------------------------------


def test_spec_lists_fields_in_declaration_order_with_inheritance():
    spec = Child2.__kit_spec__
    assert spec.inner_names == ("payload", "extra", "more")
    assert spec.meta_names == ("scale_hint", "kind", "level")
    assert spec.primary == "payload"
    assert_expected_inline(
        repr(spec),
        """<spec of Child2: payload: inner, extra: inner(optional), more: inner(optional), scale_hint: meta(default=1.0), kind: meta, level: meta(default=3)>""",
    )


def test_exemplar_specs():
    assert BlockScaled.__kit_spec__.inner_names == ("qdata", "scale")
    assert BlockScaled.__kit_spec__.meta_names == ("block",)
    assert BlockScaled.__kit_spec__.meta_defaults == (32,)
    assert ScaledTensor.__kit_spec__.inner_names == ("qdata", "scale")
    assert TwoTensor.__kit_spec__.inner_names == ("a", "b")
    assert TwoTensor.__kit_spec__.meta_names == ()


def test_meta_fields_read_through_properties_and_are_read_only():
    x = Base2(torch.ones(2), kind="m")
    assert (x.scale_hint, x.kind) == (1.0, "m")
    with pytest.raises(AttributeError):
        x.kind = "other"
    assert x.__tensor_flatten__()[1].kind == "m"


def test_classvar_annotation_is_not_a_field():
    assert WithClassVar.__kit_spec__.inner_names == ("payload",)
    assert WithClassVar.__kit_spec__.meta_names == ()
    assert WithClassVar.registry == {}


def test_abstract_intermediate_base_is_allowed_and_shares_its_meta():
    assert AbstractBase.__kit_spec__.inner_names == ()
    c = Concrete(payload=torch.zeros(3))
    assert c.tag == "abs"
    # Positional order is declaration order, inherited fields first.
    assert Concrete("t", torch.zeros(3)).tag == "t"
    assert Concrete.__kit_spec__.fields[0].name == "tag"


def test_default_ctx_from_meta_defaults():
    ctx = BlockScaled.__default_ctx__()
    assert ctx.block == 32
    assert ctx.dtype == torch.get_default_dtype()
    with pytest.raises(TypeError, match="kind"):
        Base2.__default_ctx__()


def test_default_inner_shapes_give_every_inner_the_outer_size():
    assert TwoTensor.__inner_shapes__((3, 4), TwoTensor.__default_ctx__()) == {"a": (3, 4), "b": (3, 4)}
    assert BlockScaled.__inner_shapes__((70, 4), BlockScaled.__default_ctx__()) == {
        "qdata": (70, 4),
        "scale": (3, 1),
    }


# ---- bad input at class definition ---------------------------------------------------------


def test_annotation_without_specifier_is_refused():
    msg = _declaration_error(
        """
        class NoSpec(WrapperTensor):
            payload: torch.Tensor = inner()
            block: int
        """
    )
    assert_expected_inline(
        msg,
        """NoSpec.block is annotated but is neither an inner() nor a meta() field (got no value). Declare it as `block: ... = inner()` for a tensor or `block: ... = meta()` for constant metadata.""",
    )


def test_annotation_with_plain_value_is_refused_with_meta_or_classvar_hint():
    msg = _declaration_error(
        """
        class PlainValue(WrapperTensor):
            payload: torch.Tensor = inner()
            block: int = 32
        """
    )
    assert_expected_inline(
        msg,
        """PlainValue.block is annotated but is neither an inner() nor a meta() field (got int). Declare it as `block: ... = meta(default=32)` for constant metadata, or `block: ClassVar[...] = 32` for a class attribute.""",
    )


def test_specifier_without_annotation_is_refused():
    msg = _declaration_error(
        """
        class NoAnnotation(WrapperTensor):
            payload: torch.Tensor = inner()
            scale = inner()
        """
    )
    assert "NoAnnotation.scale" in msg and "annotation" in msg and "scale: torch.Tensor = inner()" in msg


def test_class_without_inner_tensor_is_refused():
    msg = _declaration_error(
        """
        class OnlyMeta(WrapperTensor):
            block: int = meta(default=32)
        """
    )
    assert_expected_inline(
        msg,
        """OnlyMeta declares no inner tensor. A wrapper subclass holds at least one tensor: add e.g. `payload: torch.Tensor = inner()` (the first one is the primary), or declare an intermediate base with `class OnlyMeta(WrapperTensor, abstract=True)`.""",
    )


def test_unhashable_meta_default_is_refused():
    msg = _declaration_error(
        """
        class ListMeta(WrapperTensor):
            payload: torch.Tensor = inner()
            dims: list = meta(default=[1, 2])
        """
    )
    assert_expected_inline(
        msg,
        """ListMeta.dims is a meta field but its default ([1, 2], a list) is not hashable. Dynamo guards meta values by == and AOTAutograd hashes them: use a tuple instead of a list, a frozenset instead of a set, or a frozen dataclass.""",
    )


def test_unpicklable_meta_default_is_refused():
    msg = _declaration_error(
        """
        class LambdaMeta(WrapperTensor):
            payload: torch.Tensor = inner()
            fn: object = meta(default=lambda: 0)
        """
    )
    assert msg.startswith("LambdaMeta.fn is a meta field but its default (<function LambdaMeta.<lambda>")
    assert "cannot be pickled" in msg and "module level" in msg


def test_tensor_meta_default_is_refused():
    msg = _declaration_error(
        """
        class TensorMeta(WrapperTensor):
            payload: torch.Tensor = inner()
            bias: object = meta(default=torch.zeros(3))
        """
    )
    assert_expected_inline(
        msg,
        """TensorMeta.bias is a meta field but its default is a tensor (Tensor of shape (3,)). Tensors in the ctx break fake-tensor tracing and caching; declare it with `bias: torch.Tensor = inner()` instead, or pass a Python value.""",
    )


def test_optional_primary_is_refused():
    msg = _declaration_error(
        """
        class OptFirst(WrapperTensor):
            maybe: torch.Tensor = inner(optional=True)
            payload: torch.Tensor = inner()
        """
    )
    assert "OptFirst.maybe" in msg and "primary" in msg and "reorder" in msg


@pytest.mark.parametrize(
    "line, words",
    [
        ("size: int = meta(default=1)", ["OptBad.size", "constructor keyword", "rename"]),
        ("_hidden: int = meta(default=1)", ["OptBad._hidden", "'_'", "rename"]),
        ("shape: int = meta(default=1)", ["OptBad.shape", "torch.Tensor.shape", "rename"]),
        ("owner: str = meta(default='x')", ["OptBad.owner", "reserved on the ctx", "rename"]),
    ],
    ids=["outer-kwarg", "underscore", "shadows-tensor-attr", "reserved-ctx-name"],
)
def test_names_that_would_break_the_protocol_are_refused(line, words):
    msg = _declaration_error(
        f"""
        class OptBad(WrapperTensor):
            payload: torch.Tensor = inner()
            {line}
        """
    )
    for w in words:
        assert w in msg, (w, msg)


def test_redeclaring_an_inherited_field_is_refused():
    msg = _declaration_error(
        """
        class Parent(WrapperTensor):
            payload: torch.Tensor = inner()
        class Kid(Parent):
            payload: torch.Tensor = inner()
        """
    )
    assert "Kid.payload" in msg and "inherited" in msg


class Token:
    """Hashable and picklable, but equal only to itself: a deepcopy is a different value."""

    def __hash__(self):
        return 1


def test_meta_default_unequal_to_its_deepcopy_is_refused():
    with pytest.raises(FieldDeclarationError) as info:

        class DeepcopyMeta(WrapperTensor):
            payload: torch.Tensor = inner()
            tok: object = meta(default=Token())

    msg = str(info.value)
    assert f"<locals>.DeepcopyMeta.tok: the default <{__name__}.Token object" in msg
    assert "not equal to its own deepcopy" in msg and "__eq__" in msg


# ---- local classes -------------------------------------------------------------------------


def test_class_defined_in_a_function_warns_that_caches_are_bypassed():
    with pytest.warns(LocalClassWarning) as record:

        class Local(WrapperTensor):
            payload: torch.Tensor = inner()

    assert len(record) == 1
    msg = str(record[0].message)
    assert "test_class_defined_in_a_function_warns_that_caches_are_bypassed.<locals>.Local" in msg
    assert "AOTAutograd" in msg and "module level" in msg
    # The warning points at the class statement, not at kit internals.
    assert record[0].filename == __file__
    assert issubclass(LocalClassWarning, UserWarning)


def test_abstract_local_class_does_not_warn_and_module_level_classes_never_do():
    with warnings.catch_warnings():
        warnings.simplefilter("error", LocalClassWarning)

        class LocalAbstract(WrapperTensor, abstract=True):
            pass

        ns = _define(
            """
            class TopLevel(WrapperTensor):
                payload: torch.Tensor = inner()
            """
        )
    assert ns["TopLevel"].__qualname__ == "TopLevel"


def test_fix_suggested_for_a_class_without_inner_tensor_is_itself_valid():
    # The message's example declaration must be accepted when the author copies it.
    msg = _declaration_error(
        """
        class NeedsInner(WrapperTensor):
            block: int = meta(default=32)
        """
    )
    suggestion = msg.split("add e.g. `")[1].split("`")[0]
    ns = _define(
        f"""
        class Fixed(WrapperTensor):
            {suggestion}
            block: int = meta(default=32)
        """
    )
    assert ns["Fixed"].__kit_spec__.inner_names == (suggestion.split(":")[0],)
