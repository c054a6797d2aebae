"""Child process of the stable-hash check: read a list of pickles (one per subject, each a
list of encoded samples) on stdin, print their hashes as JSON (the same nesting). Run as ``python -m subclass_kit.testing._hash_child``."""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any


def main() -> int:
    # One pickle per subject, loaded one at a time: a subject whose samples cannot be
    # rebuilt here fails its own row with the real cause, not every subject's.
    payload = pickle.loads(sys.stdin.buffer.read())
    from subclass_kit.testing._hashing import decode, stable_hash

    out: list[Any] = []
    for blob in payload:
        try:
            subject = pickle.loads(blob)
        except Exception as e:
            out.append({"load_error": f"{type(e).__name__}: {e}"})
            continue
        rows: list[dict[str, str]] = []
        for d in subject:
            try:
                x = decode(d)
                rows.append({"hash": stable_hash(x), "canonical": stable_hash(x, canonical=True)})
            except Exception as e:  # reported by the parent, row by row
                rows.append({"error": f"{type(e).__name__}: {e}"})
        out.append(rows)
    sys.stdout.write(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
