"""A fresh process with a warm TORCHINDUCTOR_CACHE_DIR hits the FX graph and AOTAutograd
caches for a kit wrapper input with a dynamic dim whose cache hash is ``guards.cache_key``
(torch's own TwoTensor is recorded beside it: its default hash cannot key symbolic shapes, so
AOTAutograd bypasses its cache). The kit's default hash is tests/subclass_kit/test_compile_cache.py's."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _run(cache_dir) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}")
    # Imported, not run as __main__: the wrapper class must have the same module name as in
    # the cold run, since the module is part of a class's identity (and of its cache key).
    code = "import json, _guards_cache_script as m; print(json.dumps(m.main(), sort_keys=True))"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.dist
def test_warm_cache_hits_in_a_fresh_process(tmp_path, record_property):
    # Cold: a fresh process writing into an empty cache dir. Warm: another fresh process
    # reading it. The cold run is not done in the pytest process: the cache keys include
    # process state that earlier test modules may have changed (torch's AOTI compile used to
    # leave its device facts in torch._inductor.config, and torch's default subclass hash
    # pickles torch.contiguous_format under whichever module imported torch first), and the
    # claim is about one fresh process reusing what another wrote.
    cold = _run(tmp_path)
    warm = _run(tmp_path)
    record_property("cold", cold)
    record_property("warm", warm)
    print("cold", cold, "\nwarm", warm)
    for kind in ("kit_guards_key",):
        assert cold[kind]["correct"] and warm[kind]["correct"]
        assert cold[kind].get("autograd_cache_miss") == 1 and cold[kind].get("fxgraph_cache_miss") == 1, cold
        assert warm[kind].get("autograd_cache_hit") == 1, warm
        assert warm[kind].get("fxgraph_cache_hit", 0) + warm[kind].get("autograd_cache_hit", 0) >= 1
        assert "autograd_cache_miss" not in warm[kind] and "fxgraph_cache_miss" not in warm[kind], warm
    # torch's TwoTensor, recorded for comparison (not asserted: it is torch's behaviour).
    assert warm["torch"]["correct"]
