"""Run in a fresh process: compile one function per wrapper kind with inductor and print the
FX-graph and AOTAutograd cache counters each compile produced (JSON, one line).

The kit's TwoTensor with its own default hash is tests/subclass_kit/test_compile_cache.py's
case (a second fresh process hits both caches with a dynamic dim); here, the hash that
``guards.cache_key`` gives, beside torch's TwoTensor."""

import json

import torch
from torch._dynamo.utils import counters
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

import guards
from subclass_kit.examples import TwoTensor


class KeyedTwoTensor(TwoTensor):
    """The kit's TwoTensor with its cache hash taken from guards.cache_key."""

    def _stable_hash_for_caching(self):
        return guards.cache_key(self)


# One function per kind, so that no compile can reuse another kind's graph.
FNS = {
    "kit_guards_key": lambda x: (x * 3 + 1).sin(),
    "torch": lambda x: (x * 4 + 1).sin(),
}
CLASSES = {"kit_guards_key": KeyedTwoTensor, "torch": TorchTwoTensor}


def main() -> dict:
    out = {}
    for kind, fn in FNS.items():
        x = CLASSES[kind](torch.randn(8, 4), torch.randn(8, 4))
        torch._dynamo.mark_dynamic(x, 0)
        before = {k: dict(counters[k]) for k in ("inductor", "aot_autograd")}
        res = torch.compile(fn, backend="inductor", fullgraph=True)(x)
        ref = fn(x)
        delta = {}
        for k in ("inductor", "aot_autograd"):
            for name, v in counters[k].items():
                d = v - before[k].get(name, 0)
                if d and "cache" in name:
                    delta[name] = d
        delta["correct"] = bool(torch.allclose(res.a, ref.a) and torch.allclose(res.b, ref.b))
        out[kind] = delta
    return out


if __name__ == "__main__":
    print(json.dumps(main(), sort_keys=True))
