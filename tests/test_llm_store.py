"""LLM nodes across processes: a stable node PASSes in a new process without a model call; a
NACK recorded in one process withdraws the candidate in the next; a node that gave up keeps its
report and does not call the model again until something changes; damaged state is a miss."""

from __future__ import annotations

import gc

import pytest

from store_progs.harness import run_program


@pytest.fixture(autouse=True)
def _collect_dead_cells():
    gc.collect()


STORY = '''
request = rt.input("request", P.get("request", "paid orders, not refunded"))
rows = rt.input("rows", P.get("rows", [[1, 1, 0], [2, 1, 1]]))
ANSWERS = ["WHERE paid", "WHERE paid AND NOT refunded", "WHERE paid AND NOT refunded -- v3"]

@incr.validator(version="1")
def refunds(candidate, r):
    ran.append("C:" + candidate)
    if "refunded" in candidate:
        yield incr.ACK("refunds")
    else:
        yield incr.NACK("refunds", counterexample={"rows": [[2, 1, 1]], "expected": 0, "got": 1})

@incr.llm(validators=[refunds], version="b1", budget=incr.Budget(max_attempts=P.get("max", 4)))
def write_sql(r, *, previous=None, feedback=()):
    ran.append("B")
    if feedback:
        ran.append("fb:" + ",".join(f.case for f in feedback))
    request.get()
    n = P.get("offset", 0) + sum(1 for x in ran if x == "B") - 1
    return ANSWERS[min(n, len(ANSWERS) - 1)]

@incr.cell
def run_query(r):
    ran.append("Q")
    sql = write_sql(r)
    return [row[0] for row in rows.get() if row[1] and ("refunded" not in sql or not row[2])]

with rt:
    try:
        values = {"result": run_query("q")}
    except incr.NotAccepted as e:
        values = {"failed": e.reason, "report": e.report, "best": e.best}
    if P.get("nack"):
        rt.nack(write_sql, "q", revision=rt.state(write_sql, "q").revision, case="human",
                counterexample="not like this")
    st = rt.state(write_sql, "q")
    values.update(status=st.status, revision=st.revision, checks=len(st.checks),
                  generations=rt.stats()["generations"])
'''


def test_stable_node_passes_in_a_new_process_without_a_model_call(tmp_path):
    store = tmp_path / "s"
    first = run_program(tmp_path, STORY, store)
    assert first["values"]["result"] == [1]
    assert first["ran"].count("B") == 2 and first["values"]["revision"] == 2
    second = run_program(tmp_path, STORY, store)
    assert second["values"]["result"] == [1]
    assert second["ran"] == []                      # no generator, no validator, no query
    assert second["values"]["status"] == "stable" and second["values"]["revision"] == 2
    assert second["values"]["generations"] == 0


def test_changing_the_data_reruns_the_query_not_the_generation(tmp_path):
    store = tmp_path / "s"
    run_program(tmp_path, STORY, store)
    again = run_program(tmp_path, STORY, store, {"rows": [[1, 1, 0], [2, 1, 1], [3, 1, 0]]})
    assert again["values"]["result"] == [1, 3]
    assert again["ran"] == ["Q"]


def test_a_nack_in_one_process_withdraws_the_candidate_in_the_next(tmp_path):
    store = tmp_path / "s"
    first = run_program(tmp_path, STORY, store, {"nack": True})
    assert first["values"]["status"] == "invalid"
    second = run_program(tmp_path, STORY, store, {"offset": 2})
    # the stored accepted candidate is not taken back: B regenerates, with the feedback
    assert second["ran"].count("B") == 1 and "Q" in second["ran"]
    assert "fb:human,refunds" in second["ran"]      # the NACK and the regression case
    assert second["values"]["revision"] == 3 and second["values"]["status"] == "stable"


def test_a_failed_node_keeps_its_report_and_calls_nothing_until_a_change(tmp_path):
    store = tmp_path / "s"
    first = run_program(tmp_path, STORY, store, {"max": 1})
    assert first["values"]["failed"] == "budget"
    second = run_program(tmp_path, STORY, store, {"max": 1})
    assert second["values"]["failed"] == "budget"
    assert "B" not in second["ran"] and second["values"]["generations"] == 0
    assert second["values"]["report"] == first["values"]["report"]
    third = run_program(tmp_path, STORY, store, {"max": 1, "request": "another wording"})
    assert third["ran"].count("B") == 1            # a new context: a fresh budget


def test_damaged_node_state_is_a_miss(tmp_path):
    import lmdb
    store = tmp_path / "s"
    run_program(tmp_path, STORY, store, {"nack": True})
    env = lmdb.open(str(store), max_dbs=8)
    nodes = env.open_db(b"nodes")
    with env.begin(write=True) as txn:
        keys = [k for k, _ in txn.cursor(db=nodes)]
        assert keys
        for k in keys:
            v = bytearray(txn.get(k, db=nodes))
            v[-3] ^= 0xFF
            txn.put(k, bytes(v), db=nodes)
    env.close()
    second = run_program(tmp_path, STORY, store, {"offset": 1})
    assert any(w[0] == "DamagedRecordWarning" for w in second["warnings"])
    # without its state the node starts afresh: the stored entry is an accepted candidate
    assert second["values"]["result"] == [1]


def test_inspect_lists_llm_node_statuses_and_verdicts(tmp_path):
    import json
    import subprocess
    import sys

    store = tmp_path / "s"
    run_program(tmp_path, STORY, store)
    run_program(tmp_path, STORY, store, {"nack": True})
    out = subprocess.run([sys.executable, "-m", "incr.cli", "inspect", str(store), "--json"],
                         capture_output=True, text=True, check=True).stdout
    (node,) = json.loads(out)["llm_nodes"]
    assert node["label"] == "write_sql('q')" and node["status"] == "invalid"
    assert node["revision"] == 2 and node["verdicts"]["NACK"] == 1
    assert node["verdicts"]["ACK"] == 1 and node["regressions"] == 2
    text = subprocess.run([sys.executable, "-m", "incr.cli", "inspect", str(store)],
                          capture_output=True, text=True, check=True).stdout
    assert "write_sql('q')  invalid, revision 2, ACK 1 NACK 1" in text


def test_a_cell_closing_over_an_llm_node_changes_identity_with_its_validators():
    import incr
    from incr import keys

    def make(version):
        @incr.validator(version=version)
        def check(candidate, x):
            return incr.ACK("a")

        @incr.llm(validators=[check], version="p")
        def node(x, *, previous=None, feedback=()):
            return "x"

        @incr.cell
        def reader(x):
            return node(x)

        return keys.closure_fingerprint(reader.fn)[0]

    assert make("1") == make("1")
    assert make("1") != make("2")
