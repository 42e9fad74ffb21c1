"""``incr graph``: every drawn edge is a dependency the programs really had, in all three
formats; DOT is checked by Graphviz's own parser, HTML in a real browser (Chromium, through
Playwright): every node visible, no edge through a box it does not connect, LLM nodes and
validators drawn as such.

The truth the drawings are compared with is written out by hand below (``SHEET``, ``SQL``,
``FILES``): the dependencies the programs were written to have."""

import json
import os
import shutil
import subprocess

import pytest

import incr
from incr.cli import main
from incr.graph import STATUS_COLOUR

# what each program reads, by label: (what is read, what reads it)
SHEET = {("items", "subtotal()"), ("tax_rate", "tax()"),
         *{(f"{k}:{n}", f"line('{n}')") for n in ("apples", "bread", "coffee")
           for k in ("price", "qty")},
         *{(f"line('{n}')", "subtotal()") for n in ("apples", "bread", "coffee")},
         ("subtotal()", "tier()"), ("tier()", "discount()"),
         ("subtotal()", "tax()"), ("discount()", "tax()"),
         ("subtotal()", "total()"), ("discount()", "total()"), ("tax()", "total()")}
SQL = {("request", "interpret('q')"), ("interpret('q')", "write_sql('q')"),
       ("write_sql('q')", "answer('q')"), ("orders", "answer('q')")}
SQL_VERDICTS = {("interpret('q')", "spec_checks"), ("write_sql('q')", "sql_checks")}
WIDE = 40
FILES = {(f"file:data/{i:02}.txt", f"size({i})") for i in range(WIDE)} | {
    (f"size({i})", "sizes()") for i in range(WIDE)} | {
    ("sizes()", "report()"), ('odd "name" \\ x', "report()"), ("file:data/00.txt", "report()")}


def files_program(path):
    rt = incr.Runtime(store=path)
    files = [rt.input(f"file:data/{i:02}.txt", "x" * i) for i in range(WIDE)]
    odd = rt.input('odd "name" \\ x', 1)

    @incr.cell(version="1")
    def size(i):
        return len(files[i].get())

    @incr.cell(version="1")
    def sizes():
        return sum(size(i) for i in range(WIDE))

    @incr.cell(version="1")
    def report():   # reads across layers: an input (layer 0) and sizes() (layer 2)
        return f"{sizes()} {odd.get()} {files[0].get()}"

    with rt:
        report()
    rt.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One store shared by three programs: the SQL demo, the spreadsheet demo, a wide one."""
    path = str(tmp_path_factory.mktemp("g") / "store")
    assert main(["demo", "--store", path, "--json"]) == 0
    assert main(["demo", "--sheet", "--store", path, "--json"]) == 0
    files_program(path)
    return path


def by_label(g):
    lab = {k: n["label"] for k, n in g["nodes"].items()}
    return ({(lab[a], lab[b]) for a, b in g["edges"]},
            {(lab[v["node"]], lab[v["validator"]]) for v in g["verdicts"]}, lab)


def graph_json(path, *extra):
    from incr.cli import _parser, graph_cmd
    import io
    buf = io.StringIO()
    args = _parser().parse_args(["graph", path, "--json", *extra])
    assert graph_cmd(path, "json", None, buf, all_versions=args.all) == 0
    return json.loads(buf.getvalue())


def test_json_edges_are_exactly_the_real_dependencies(shared):
    g = graph_json(shared)
    edges, verdicts, lab = by_label(g)
    assert edges == SHEET | SQL | FILES
    assert verdicts == SQL_VERDICTS
    kinds = {lab[k]: n["kind"] for k, n in g["nodes"].items()}
    assert kinds["interpret('q')"] == kinds["write_sql('q')"] == "llm"
    assert kinds["sql_checks"] == kinds["spec_checks"] == "validator"
    assert {g["nodes"][k]["status"] for k in g["nodes"] if kinds[lab[k]] == "llm"} == {"stable"}


def dot_json(text):
    """Graphviz's own reading of ``text``: node names and (tail, head) name pairs."""
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed (Debian: apt-get install graphviz)")
    p = subprocess.run(["dot", "-Tjson0"], input=text, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    names = [o["name"] for o in d.get("objects", [])]
    labels = {o["name"]: o.get("label") for o in d.get("objects", [])}
    return names, {(names[e["tail"]], names[e["head"]]) for e in d.get("edges", [])}, labels


def test_dot_is_read_by_graphviz_as_the_same_graph(shared, capsys):
    assert main(["graph", shared]) == 0
    text = capsys.readouterr().out
    names, pairs, labels = dot_json(text)
    g = graph_json(shared)
    # every id stays one node: `price:apples` is not node `price` port `apples`, `file:a.txt`
    # parses, quotes and backslashes in a name survive
    assert sorted(names) == sorted(g["nodes"])
    inputs = {k: n["label"] for k, n in g["nodes"].items() if n["kind"] == "input"}
    assert {"price:apples", "file:data/00.txt", 'odd "name" \\ x'} <= set(inputs.values())
    # the label as Graphviz reads it (an escString: a backslash escapes the next character)
    for k, lab in inputs.items():
        assert labels[k].replace("\\\\", "\\").replace('\\"', '"') == lab
    assert pairs == {tuple(e) for e in g["edges"]} | {(v["node"], v["validator"])
                                                      for v in g["verdicts"]}


def test_superseded_instances_are_hidden_marked_and_shown_on_request(tmp_path, capsys):
    path = str(tmp_path / "s")
    for version, factor in (("1", 2), ("2", 3)):      # a body edit: a new version
        rt = incr.Runtime(store=path)
        x = rt.input("x", 5)

        @incr.cell(version=version)
        def top(n):
            return x.get() * factor * n

        with rt:
            top(3)
        rt.close()
    g = graph_json(path)
    assert [n["label"] for n in g["nodes"].values() if n["kind"] == "cell"] == ["top(3)"]
    assert {n.get("superseded") for n in g["nodes"].values() if n["kind"] == "cell"} == {False}
    g = graph_json(path, "--all")
    tops = [n for n in g["nodes"].values() if n["kind"] == "cell"]
    assert sorted(n["superseded"] for n in tops) == [False, True]
    names, _, _ = dot_json(main(["graph", path, "--all"]) == 0 and capsys.readouterr().out)
    assert len(names) == 3
    # inspect marks it, and says how to drop it
    assert main(["inspect", path]) == 0
    text = capsys.readouterr().out
    rows = [ln for ln in text.splitlines() if ln.startswith("top(3)")]
    assert len(rows) == 2 and sum("superseded" in r for r in rows) == 1, text
    assert main(["inspect", path, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert sorted(r["superseded"] for r in js["instances"]) == [False, True]


def test_a_dependency_no_longer_stored_is_drawn_not_dropped(tmp_path):
    path = str(tmp_path / "s")
    rt = incr.Runtime(store=path)
    x = rt.input("x", 1)

    @incr.cell(version="1")
    def inner(k):
        return x.get() + k

    @incr.cell(version="1")
    def outer():
        return inner(7) * 2

    with rt:
        outer()
    rt.close()
    from incr.store import Store
    s = Store(path, count_run=False, create=False)
    try:
        keys = [k for k, rec, _ in s.iter_records() if rec["label"] == "inner(7)"]
        s.delete(keys)
    finally:
        s.close()
    edges, _, lab = by_label(graph_json(path))
    assert edges == {("inner(7)", "outer()")}   # x -> inner(7) went with inner's record
    g = graph_json(path)
    assert [n["kind"] for n in g["nodes"].values() if n["label"] == "inner(7)"] == ["missing"]


# --- the HTML page in a real browser -----------------------------------------------------------

def chromium():
    """Chromium through Playwright: Playwright's own build, else the system's (Debian's
    ``chromium`` package), else a skip that names what is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install 'incr[test]')")
    pw = sync_playwright().start()
    errors = []
    for kw in ({}, *({"executable_path": p} for p in
                     (shutil.which("chromium"), shutil.which("chromium-browser")) if p)):
        try:
            return pw, pw.chromium.launch(**kw)
        except Exception as e:   # no browser build where Playwright looks for one
            errors.append(str(e).splitlines()[0])
    pw.stop()
    pytest.skip("no Chromium for Playwright (python -m playwright install chromium, or "
                f"apt-get install chromium): {errors}")


MEASURE = """() => {
  const svg = document.getElementById('graph').getBoundingClientRect();
  const sx = window.scrollX, sy = window.scrollY;
  const box = e => { const r = e.getBoundingClientRect();
                     return [r.left + sx, r.top + sy, r.right + sx, r.bottom + sy]; };
  const nodes = [...document.querySelectorAll('#graph g.node')].map(g => {
    const texts = [...g.querySelectorAll('text')];
    const kind = [...g.classList].find(c => c.startsWith('kind-')).slice(5);
    return {id: g.id, kind, label: texts[0].textContent,
            superseded: g.classList.contains('superseded'),
            fill: g.querySelector('path,polygon').getAttribute('fill'),
            r: box(g.querySelector('path,polygon')), t: texts.map(box)};
  });
  const edges = [...document.querySelectorAll('#graph g.edge')].map(g => {
    const [kind, from, to] = g.id.split(':');
    const p = g.querySelector('path');
    const n = p.getTotalLength(), pts = [];
    const m = p.getScreenCTM();
    for (let i = 0; i <= 80; i++) {
      const q = p.getPointAtLength(n * i / 80);
      pts.push([q.x * m.a + q.y * m.c + m.e + sx, q.x * m.b + q.y * m.d + m.f + sy]);
    }
    return {from, to, kind, pts};
  });
  // what can be scrolled to: the drawing's box scrolls; so does the page
  const w = document.getElementById('wrap'), wr = box(w);
  return {nodes, edges, page: [document.documentElement.scrollWidth,
                               document.documentElement.scrollHeight],
          area: [wr[0] - w.scrollLeft, wr[1] - w.scrollTop,
                 wr[0] - w.scrollLeft + w.scrollWidth, wr[1] - w.scrollTop + w.scrollHeight],
          svg: [svg.left + sx, svg.top + sy, svg.right + sx, svg.bottom + sy]};
}"""


def table_rows(page, selector):
    """The text of each cell, per row, of the tables ``selector`` finds (header rows left out)."""
    return page.evaluate("""sel => [...document.querySelectorAll(sel)].map(t =>
        [...t.querySelectorAll('tr')].filter(r => r.querySelector('td'))
          .map(r => [...r.querySelectorAll('td')].map(c => c.innerText.trim())))""", selector)


def check_drawing(m, truth_deps, truth_verdicts, g):
    """What the browser drew is the trace: the same nodes (ids), the same dependencies and
    verdict edges (by label), every box visible with its label inside, no two boxes
    overlapping, no edge through a box it does not connect."""
    labels = {n["id"]: n["label"] for n in m["nodes"]}
    deps = {(labels[e["from"]], labels[e["to"]]) for e in m["edges"] if e["kind"] == "dep"}
    verdicts = {(labels[e["from"]], labels[e["to"]]) for e in m["edges"]
                if e["kind"] == "verdict"}
    assert deps == truth_deps
    assert verdicts == truth_verdicts
    assert sorted(labels) == sorted(g["nodes"])   # node count and ids match the trace
    boxes = {n["id"]: n["r"] for n in m["nodes"]}
    W, H = m["page"]
    A = m["area"]
    assert A[0] >= 0 and A[2] <= W, "the drawing's box is wider than the page"
    for n in m["nodes"]:   # visible: inside the drawing and the page, its label in its box
        x0, y0, x1, y1 = n["r"]
        assert x1 - x0 > 20 and y1 - y0 > 10, n
        assert m["svg"][0] - 0.5 <= x0 and x1 <= m["svg"][2] + 0.5 \
            and m["svg"][1] - 0.5 <= y0 and y1 <= m["svg"][3] + 0.5, n
        assert A[0] <= x0 and x1 <= A[2] and A[1] <= y0 and y1 <= A[3], n
        for t in n["t"]:
            assert x0 <= t[0] and t[2] <= x1 + 0.5, ("label overflows", n)
    ids = list(boxes)
    for i, a in enumerate(ids):   # no two boxes overlap
        for b in ids[i + 1:]:
            ra, rb = boxes[a], boxes[b]
            assert ra[2] <= rb[0] or rb[2] <= ra[0] or ra[3] <= rb[1] or rb[3] <= ra[1], \
                (labels[a], labels[b])
    for e in m["edges"]:   # no edge passes through a box it does not connect
        for k, (x0, y0, x1, y1) in boxes.items():
            if k in (e["from"], e["to"]):
                continue
            inside = [p for p in e["pts"] if x0 + 1 < p[0] < x1 - 1 and y0 + 1 < p[1] < y1 - 1]
            assert not inside, (labels[e["from"]], labels[e["to"]], "crosses", labels[k])
    return labels


def test_html_in_chromium_draws_only_real_dependencies_and_every_node(shared, tmp_path):
    out = tmp_path / "graph.html"
    assert main(["graph", shared, "--format", "html", "-o", str(out)]) == 0
    pw, browser = chromium()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(out.as_uri())
        page.check("#actual")        # actual size: the boxes as Graphviz sized them
        m = page.evaluate(MEASURE)
        check_drawing(m, SHEET | SQL | FILES, SQL_VERDICTS, graph_json(shared))
        kinds = {n["label"]: n["kind"] for n in m["nodes"]}
        assert kinds["write_sql('q')"] == "llm" and kinds["sql_checks"] == "validator"
        assert kinds["price:apples"] == "input" and kinds["total()"] == "cell"
        fill = {n["label"]: n["fill"] for n in m["nodes"]}
        assert fill["write_sql('q')"] == STATUS_COLOUR["stable"]
        # clicking an LLM node shows its status, its validators' verdicts and its attempts
        llm = next(n["id"] for n in m["nodes"] if n["label"] == "write_sql('q')")
        page.locator(f'[id="{llm}"]').click()
        assert page.locator("#llm-status").inner_text().startswith("stable, candidate revision 3")
        rows = table_rows(page, "#details table.verdicts")
        assert rows[0] == [["sql_checks", "ACK", "counts_paid", ""],
                           ["sql_checks", "ACK", "excludes_refunds", ""]]
        nack = {r[2]: r[-1] for t in rows[1:] for r in t if r[1] == "NACK"}
        assert "expected 1, got 2" in nack["excludes_refunds"], rows     # revision 1
        assert "expected 2, got 3" in nack["counts_paid"], rows          # revision 2, reverted
        cands = page.locator("#details pre.candidate").all_inner_texts()
        assert cands == ["SELECT COUNT(*) FROM orders WHERE status = 'paid'",
                         "SELECT COUNT(*) FROM orders WHERE refunded = 0",
                         "SELECT COUNT(*) FROM orders WHERE status = 'paid' AND refunded = 0"]
        assert "accepted" in page.locator("#details").inner_text()
        if os.environ.get("INCR_SCREENSHOT"):
            page.screenshot(path=os.environ["INCR_SCREENSHOT"], full_page=True)
    finally:
        browser.close()
        pw.stop()


def test_svg_is_graphviz_layout_of_the_same_graph(shared, capsys):
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed (Debian: apt-get install graphviz)")
    assert main(["graph", shared, "--format", "svg"]) == 0
    text = capsys.readouterr().out
    import xml.etree.ElementTree as ET
    root = ET.fromstring(text)
    ns = "{http://www.w3.org/2000/svg}"
    gs = list(root.iter(ns + "g"))
    nodes = {g.get("id") for g in gs if "node" in g.get("class", "").split()}
    edges = {g.get("id") for g in gs if "edge" in g.get("class", "").split()}
    g = graph_json(shared)
    assert nodes == set(g["nodes"])
    assert edges == {f"dep:{a}:{b}" for a, b in g["edges"]} | {
        f"verdict:{v['node']}:{v['validator']}" for v in g["verdicts"]}


def test_without_graphviz_the_drawings_say_what_to_install(shared, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))          # no `dot` on it
    for fmt in ("svg", "html"):
        assert main(["graph", shared, "--format", fmt, "-o", str(tmp_path / "x")]) == 1
        err = capsys.readouterr().err
        assert "Graphviz's `dot`" in err and "apt-get install graphviz" in err, err
    assert main(["graph", shared, "--format", "dot"]) == 0   # DOT itself needs no Graphviz
