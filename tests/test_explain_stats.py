"""rt.explain() says why an instance's value is what it is; rt.stats() counts what happened."""

from __future__ import annotations

import pytest

import incr
from conftest import label

# Module-level cells, so their labels are exactly the ones in API.md ("total(0.2)").
# They read the inputs of the runtime the test put in INPUTS.
INPUTS: dict = {}
LOG: list = []


@incr.cell
def subtotal():
    LOG.append("subtotal")
    return INPUTS["price"].get() * INPUTS["qty"].get()


@incr.cell
def total(tax):
    LOG.append("total")
    return round(subtotal() * (1 + tax), 2)


@pytest.fixture
def shop(rt):
    INPUTS.clear()
    LOG.clear()
    INPUTS["price"] = rt.input("price", 10.0)
    INPUTS["qty"] = rt.input("qty", 3)
    yield rt
    INPUTS.clear()
    LOG.clear()


def take():
    out = LOG[:]
    LOG.clear()
    return out


def test_labels_are_qualname_and_argument_reprs():
    assert label(total, 0.2) == "total(0.2)"
    assert label(subtotal) == "subtotal()"


def test_explain_never_computed(shop):
    assert shop.explain(total, 0.2) == "total(0.2) has never been computed on this runtime"


def test_explain_first_computation(shop):
    with shop:
        total(0.2)
    text = shop.explain(total, 0.2)
    assert text.startswith("total(0.2) was computed for the first time at revision 0")
    assert shop.explain(subtotal).startswith("subtotal() was computed for the first time at revision 0")


def test_explain_recomputation_names_the_dependency_and_revision(shop):
    with shop:
        total(0.2)
        INPUTS["qty"].set(4)
        assert total(0.2) == 48.0
    assert shop.explain(total, 0.2).startswith(
        "total(0.2) was recomputed at revision 1 because subtotal() changed at revision 1")
    assert shop.explain(subtotal).startswith(
        "subtotal() was recomputed at revision 1 because input 'qty' changed at revision 1")
    INPUTS["price"].set(11.0)  # revision 2
    with shop:
        total(0.2)
    assert "because input 'price' changed at revision 2" in shop.explain(subtotal)
    assert "at revision 2 because subtotal() changed at revision 2" in shop.explain(total, 0.2)


def test_explain_reused_and_cutoff(shop):
    with shop:
        total(0.2)
        take()
        with shop.batch():  # 7.5 * 4 == 10.0 * 3: subtotal is recomputed to an equal value
            INPUTS["price"].set(7.5)
            INPUTS["qty"].set(4)
        assert total(0.2) == 36.0
        assert take() == ["subtotal"]
    sub = shop.explain(subtotal)
    assert sub.startswith("subtotal() was recomputed at revision 1 because input")
    assert "cutoff" in sub
    tot = shop.explain(total, 0.2)
    assert tot.startswith("total(0.2) was reused")
    assert "cutoff" not in tot


def test_explain_does_not_compute(shop):
    with shop:
        total(0.2)
        take()
        INPUTS["qty"].set(5)
        text = shop.explain(total, 0.2)
        assert take() == []
        assert text.startswith("total(0.2) was computed for the first time at revision 0")
        shop.explain(total, 0.5)
        assert take() == []
        assert total(0.2) == 60.0


def test_explain_after_a_failure(rt):
    x = rt.input("x", 0)

    @incr.cell
    def inv():
        return 1 / x.get()

    with rt:
        with pytest.raises(ZeroDivisionError):
            inv()
    assert rt.explain(inv).startswith(label(inv))
    assert "raised" in rt.explain(inv)


def test_explain_with_keyword_arguments_finds_the_instance(rt):
    x = rt.input("x", 1)

    @incr.cell
    def scaled(k, offset=0):
        return x.get() * k + offset

    with rt:
        scaled(2)
    for call in ((2,), (2, 0)):
        assert rt.explain(scaled, *call).startswith(f"{label(scaled, 2, 0)} was computed")
    assert rt.explain(scaled, k=2, offset=0).startswith(f"{label(scaled, 2, 0)} was computed")
    # an instance never computed is named like any other
    assert rt.explain(scaled, 3).startswith(label(scaled, 3, 0))
    assert rt.explain(scaled, 3, offset=1).startswith(label(scaled, 3, 1))


def test_stats_keys(rt):
    s = rt.stats()
    for key in ("revision", "inputs", "instances", "computed", "recomputed", "reused", "cutoff",
                "failed", "store_hits", "store_misses", "generations", "validations"):
        assert key in s, key
    assert all(v == 0 for v in s.values()), s


def test_stats_counters_move(shop):
    def delta(before):
        now = shop.stats()
        return {k: now[k] - before[k] for k in now if now[k] != before[k]}

    s0 = shop.stats()
    assert (s0["inputs"], s0["instances"]) == (2, 0)
    with shop:
        total(0.2)
        assert delta(s0) == {"instances": 2, "computed": 2}
        s1 = shop.stats()
        total(0.2), subtotal()
        assert delta(s1) == {}
        INPUTS["qty"].set(4)
        assert delta(s1) == {"revision": 1}
        total(0.2)
        assert delta(s1) == {"revision": 1, "recomputed": 2}
        s2 = shop.stats()
        with shop.batch():
            INPUTS["price"].set(8.0)  # 8.0 * 5 == 10.0 * 4: same subtotal
            INPUTS["qty"].set(5)
        assert total(0.2) == 48.0
        # subtotal re-ran to an equal value (a recomputation and a cutoff); total was reused
        assert delta(s2) == {"revision": 1, "recomputed": 1, "cutoff": 1, "reused": 1}
        s3 = shop.stats()
        INPUTS["qty"].set("many")
        with pytest.raises(TypeError):
            total(0.2)  # subtotal raises, and so does total, which reads it
        assert delta(s3) == {"revision": 1, "failed": 2}
    assert take() == ["total", "subtotal",  # first computation
                      "subtotal", "total",  # qty changed
                      "subtotal",  # cut off
                      "subtotal", "total"]  # failed, each once


def test_stats_count_failed_runs_each_time(rt):
    x = rt.input("x", 0)

    @incr.cell
    def inv():
        return 1 / x.get()

    with rt:
        for _ in range(3):
            with pytest.raises(ZeroDivisionError):
                inv()
    assert rt.stats()["failed"] == 3
    assert rt.stats()["computed"] == 0
    x.set(2)
    with rt:
        assert inv() == 0.5
    assert rt.stats()["computed"] == 1
