"""The fresh-process hash row tells torch's own instabilities apart from the class's.

torch's default subclass hash pickles ``torch.contiguous_format`` (a bare global name) under
the first module in ``sys.modules`` that holds torch; a module that imports torch before
``torch._utils`` exists changes the bytes. A jagged NestedTensor's outer size holds a nested
int whose pickle carries a per-process id.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from subclass_kit.testing import check_subclass
from subclass_kit._compat import default_stable_hash

# A program whose first torch importer is a module (not __main__): torch's default hash of
# TwoTensor differs from a fresh interpreter's, the canonical payload does not, and the row
# passes saying why.
_EARLY_IMPORTER = textwrap.dedent(
    """
    import sys, types
    early = types.ModuleType("early_importer")
    sys.modules["early_importer"] = early
    import torch
    early.torch = torch
    from torch.testing._internal.two_tensor import TwoTensor
    from subclass_kit.testing import check_subclass
    from subclass_kit._compat import default_stable_hash

    t = TwoTensor(torch.randn(4, 3), torch.randn(4, 3))
    print(default_stable_hash(t))
    print(default_stable_hash(t, canonical=True))
    row = check_subclass(t, only=["identity.stable_hash"], export=False).row("identity.stable_hash")
    print(row.status, row.message)
    """
)


def test_import_order_of_torch_is_not_blamed_on_the_class():
    from torch.testing._internal.two_tensor import TwoTensor

    out = subprocess.run([sys.executable, "-c", _EARLY_IMPORTER], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    raw, canonical, row = out.stdout.strip().splitlines()[-3:]
    t = TwoTensor(torch.randn(4, 3), torch.randn(4, 3))
    # the scenario is real: torch's own hash differs between the two programs...
    assert raw != default_stable_hash(t)
    # ...and only by its import-order-dependent pickling
    assert canonical == default_stable_hash(t, canonical=True)
    assert row.startswith("pass "), row
    assert "another module order" in row, row


def test_nested_int_in_the_outer_size_is_named_as_the_cause():
    def njt():
        return torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)], layout=torch.jagged)

    a, b = njt(), njt()
    # torch's own fact: two equal jagged tensors hash differently in one process
    assert default_stable_hash(a) != default_stable_hash(b)
    row = check_subclass([a, b], only=["identity.stable_hash"], export=False).row("identity.stable_hash")
    assert row.status == "fail", row.message
    assert "nested int" in row.message and "per-process counter" in row.message, row.message
    assert "sets of strings" not in row.message, row.message
