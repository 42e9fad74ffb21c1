"""rt.explain across processes: a cell recomputed because a dependency's content differs from
every stored run says which dependency, not "computed for the first time"."""

from __future__ import annotations

import incr


def build(rt):
    x = rt.input("x", 1)

    @incr.cell(version="1")
    def double():
        return x.get() * 2

    @incr.cell(version="1")
    def total():
        return double() + 1
    return x, double, total


def test_a_recomputation_in_a_new_process_names_the_dependency_that_changed(tmp_path):
    path = str(tmp_path / "s")
    rt = incr.Runtime(store=path)
    x, double, total = build(rt)
    with rt:
        assert total() == 3
        assert "for the first time" in rt.explain(total)     # nothing stored yet
    rt.close()

    rt = incr.Runtime(store=path)
    x, double, total = build(rt)
    x.set(5)
    with rt:
        assert total() == 11
    why = rt.explain(double)
    assert "input 'x' changed since the stored run" in why and "first time" not in why
    assert "double() changed since the stored run" in rt.explain(total)
    rt.close()

    rt = incr.Runtime(store=path)                # the same content as a stored run: taken
    x, double, total = build(rt)
    x.set(5)
    with rt:
        assert total() == 11
    assert "taken from the store" in rt.explain(total)
    rt.close()
