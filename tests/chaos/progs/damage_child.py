"""Child of test_chaos_damage.py (not collected by pytest).

``damage_child.py build STORE``: computes top() (and so every mid and leaf) on a new store.
``damage_child.py check STORE``: a new runtime on STORE demands top(), every mid(j) and every
leaf(i), and prints one JSON line: the labels whose value differs from the plain function
(``wrong``), the cells that ran, the DamagedRecordWarnings (messages), and the exception that
ended it, if any (``store_error`` for incr.StoreError, ``other`` for anything else).

The cells are defined here, so that their identity (module, name, version) is the same in
every run of this program.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings

import incr
import incr.store

N_LEAVES = 8
ran = []


def leaf_value(i, x):
    size = 40 if i % 2 else 3000 + 500 * i       # odd: inline in a page; even: overflow pages
    # (keys in sorted order: what is attacked here is damage, not dict order)
    return {"blob": hashlib.sha256(f"{i}.{x}".encode()).digest() * (size // 32), "i": i,
            "t": (i, -0.0), "x": x}


def mid_value(j, x):
    a, b = leaf_value(2 * j, x), leaf_value(2 * j + 1, x)
    return [j, a["blob"][:4], b["blob"][:4], a["t"], x]


def top_value(x):
    return hashlib.sha256(repr([mid_value(j, x) for j in range(N_LEAVES // 2)]).encode()).hexdigest()


def main():
    mode, store = sys.argv[1], sys.argv[2]
    out = {"wrong": [], "ran": [], "damaged": [], "store_error": None, "other": None}
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            rt = incr.Runtime(store=store)
            x = rt.input("x", 5)

            @incr.cell(version="1")
            def leaf(i):
                ran.append(f"leaf({i})")
                size = 40 if i % 2 else 3000 + 500 * i
                return {"blob": hashlib.sha256(f"{i}.{x.get()}".encode()).digest() * (size // 32),
                        "i": i, "t": (i, -0.0), "x": x.get()}

            @incr.cell(version="1")
            def mid(j):
                ran.append(f"mid({j})")
                a, b = leaf(2 * j), leaf(2 * j + 1)
                return [j, a["blob"][:4], b["blob"][:4], a["t"], x.get()]

            @incr.cell(version="1")
            def top():
                ran.append("top()")
                return hashlib.sha256(repr([mid(j) for j in range(N_LEAVES // 2)]).encode()
                                      ).hexdigest()

            with rt:
                got = {"top()": top()}
                if mode == "check":
                    got.update({f"mid({j})": mid(j) for j in range(N_LEAVES // 2)})
                    got.update({f"leaf({i})": leaf(i) for i in range(N_LEAVES)})
            rt._check()
            rt.close()
            want = {"top()": top_value(5)}
            want.update({f"mid({j})": mid_value(j, 5) for j in range(N_LEAVES // 2)})
            want.update({f"leaf({i})": leaf_value(i, 5) for i in range(N_LEAVES)})
            for label, v in got.items():
                # equality that also tells -0.0 from 0.0 and a tuple from a list
                if repr(v) != repr(want[label]) or v != want[label]:
                    out["wrong"].append(label)
        except incr.StoreError as e:
            out["store_error"] = str(e)
        except Exception as e:
            out["other"] = f"{type(e).__module__}.{type(e).__name__}: {e}"
    out["ran"] = ran
    out["damaged"] = [str(w.message) for w in caught
                      if issubclass(w.category, incr.store.DamagedRecordWarning)]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
