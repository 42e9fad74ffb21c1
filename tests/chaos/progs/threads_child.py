"""Child of test_chaos_threads.py (not collected by pytest).

``threads_child.py SEED THREADS CALLS MODE STORE``: one runtime (on STORE, or in memory if STORE
is ``-``) and THREADS threads that each make CALLS seeded random public calls on it: demands
(``with rt: cell()``, sometimes lingering in the ``with``), ``Input.set``, batches, ``stabilize``, ``observe``, ``Observer.value``,
``Observer.stop``, ``rt.nack``/``rt.state`` on an LLM node, ``explain``, ``stats``; with MODE
``close`` one thread also calls ``rt.close()`` at a random moment. The thread switch interval is
tiny, so the calls interleave inside one another.

Every call must work or raise ``incr.IncrError`` (a subclass included); any other exception is
recorded as bad. Every value a call returns is checked for consistency (it carries the inputs it
was computed from: a mix of two revisions shows). At the end (MODE ``open``) the runtime must
pass ``_check()`` and give from-scratch values. Prints one JSON line.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import traceback

import incr

K = 3


def pair_value(k, a, b):
    return (k, a, b, a * 31 + b)


def main():
    seed, nthreads, ncalls, mode, store = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                           sys.argv[4], sys.argv[5])
    sys.setswitchinterval(1e-6)
    rt = incr.Runtime(store=None if store == "-" else store)
    xs = [rt.input(f"x{k}", k) for k in range(K)]

    @incr.cell
    def pair(k):
        s = 0
        for i in range(200):       # room for a thread switch inside a run
            s += i
        a, b = xs[k].get(), xs[(k + 1) % K].get()
        return pair_value(k, a, b)

    @incr.cell
    def total():
        ps = tuple(pair(k) for k in range(K))
        return (ps, sum(p[3] for p in ps))

    @incr.llm(version="1")
    def gen(topic, *, previous=None, feedback=()):
        return f"{topic}:{xs[0].get()}"

    observers = []
    lock = threading.Lock()
    out = {"calls": 0, "ok": 0, "incr_errors": 0, "bad": [], "inconsistent": [],
           "closed_by": None}

    def consistent_total(v):
        ps, s = v
        if s != sum(p[3] for p in ps):
            return False
        for k, p in enumerate(ps):
            if p != pair_value(k, p[1], p[2]) or p[2] != ps[(k + 1) % K][1]:
                return False
        return True

    def check(what, v):
        if what == "total" and not consistent_total(v):
            out["inconsistent"].append(["total", repr(v)])
        elif what == "pair" and v != pair_value(v[0], v[1], v[2]):
            out["inconsistent"].append(["pair", repr(v)])

    def demand(rng):
        if rng.random() < 0.5:
            with rt:
                check("total", total())
        else:
            with rt:
                check("pair", pair(rng.randrange(K)))

    def linger(rng):
        # stays inside `with rt:` a little after its demand, so that other threads' `with rt:`
        # blocks open and close inside this one
        with rt:
            check("pair", pair(rng.randrange(K)))
            time.sleep(0.0002)

    def set_one(rng):
        xs[rng.randrange(K)].set(rng.randrange(50))

    def batch(rng):
        with rt.batch():
            for _ in range(2):
                xs[rng.randrange(K)].set(rng.randrange(50))

    def stabilize(rng):
        rt.stabilize()

    def observe(rng):
        o = rt.observe(total) if rng.random() < 0.5 else rt.observe(pair, rng.randrange(K))
        with lock:
            observers.append(o)

    def read_observer(rng):
        with lock:
            o = rng.choice(observers) if observers else None
        if o is not None:
            v = o.value
            check("total" if len(v) == 2 else "pair", v)

    def stop(rng):
        with lock:
            o = observers.pop(rng.randrange(len(observers))) if observers else None
        if o is not None:
            o.stop()

    def nack(rng):
        with rt:
            gen("t")
        st = rt.state(gen, "t")
        rt.nack(gen, "t", revision=st.revision, case=f"c{rng.randrange(3)}",
                counterexample={"seen": st.candidate})

    def talk(rng):
        rt.explain(total)
        rt.stats()

    actions = [demand, demand, demand, linger, set_one, set_one, batch, stabilize, stabilize, observe,
               read_observer, stop, nack, talk]

    def worker(t):
        rng = random.Random(seed * 1000 + t)
        close_at = rng.randrange(ncalls) if mode == "close" and t == 0 else -1
        for i in range(ncalls):
            act = rng.choice(actions) if i != close_at else None
            with lock:
                out["calls"] += 1
            try:
                if act is None:
                    rt.close()
                    out["closed_by"] = t
                else:
                    act(rng)
                with lock:
                    out["ok"] += 1
            except incr.IncrError:
                with lock:
                    out["incr_errors"] += 1
            except Exception as e:
                with lock:
                    out["bad"].append(f"{act.__name__ if act else 'close'}: "
                                      f"{type(e).__module__}.{type(e).__name__}: {e} | "
                                      + traceback.format_exc(limit=-3).replace("\n", " / "))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.setswitchinterval(0.005)

    out["final_wrong"] = []
    if mode == "open":
        rt._check()
        rt.stabilize()
        rt._check()
        vals = [x.get() for x in xs]
        with rt:
            want = tuple(pair_value(k, vals[k], vals[(k + 1) % K]) for k in range(K))
            got = total()
            if got != (want, sum(p[3] for p in want)):
                out["final_wrong"].append(["total", repr(got), repr(want)])
        for o in observers:
            v = o.value
            if len(v) == 2 and v != got:
                out["final_wrong"].append(["observer", repr(v), repr(got)])
        rt.close()
    elif out["closed_by"] is not None:
        # after close, every call is refused with IncrError
        try:
            with rt:
                total()
            out["final_wrong"].append(["closed runtime computed", ""])
        except incr.IncrError:
            pass
    out["bad_count"] = len(out["bad"])
    out["bad"] = out["bad"][:10]
    out["inconsistent_count"] = len(out["inconsistent"])
    out["inconsistent"] = out["inconsistent"][:10]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
