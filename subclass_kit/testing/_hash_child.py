"""Child process of the stable-hash check: read pickled samples on stdin, print their
hashes as JSON. Run as ``python -m subclass_kit.testing._hash_child``."""

from __future__ import annotations

import json
import pickle
import sys


def main() -> int:
    payload = pickle.loads(sys.stdin.buffer.read())
    from subclass_kit.testing._hashing import decode, stable_hash

    out = []
    for d in payload:
        try:
            out.append({"hash": stable_hash(decode(d))})
        except Exception as e:  # reported by the parent, row by row
            out.append({"error": f"{type(e).__name__}: {e}"})
    sys.stdout.write(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
