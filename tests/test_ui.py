"""``incr ui STORE``: the live page, served by the real command (a separate process, as a user
runs it) and driven in a real browser (Chromium through Playwright).

Checked: the page loads; its nodes are the instances ``incr inspect --json`` lists (the
superseded ones only after the toggle) plus the trace's inputs and validators; its edges are
the dependencies the programs were written to have (``test_graph_outputs``' hand-written
truth); clicking an LLM node shows its verdicts with their counterexamples, its attempts and
its stop reason; another program writing to the store while the page is open appears on it
without a reload; without Graphviz the page says what to install and still lists the nodes."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import incr
from incr.cli import main
from incr.graph import STATUS_COLOUR

from test_graph_outputs import MEASURE, SHEET, SQL, SQL_VERDICTS, check_drawing, chromium, \
    graph_json, table_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the second program: a cell, and an LLM node its validator never accepts (it fails: no value
# is stored, what it read is in its saved state)
SECOND = textwrap.dedent('''
    import sys
    import incr

    rt = incr.Runtime(store=sys.argv[1])
    topic = rt.input("topic", "refunds")

    @incr.validator(version="1")
    def has_title(text, key):
        if text.startswith("#"):
            yield incr.ACK("title")
        else:
            yield incr.NACK("title", counterexample=text[:30], message="no '#' title line")

    @incr.llm(validators=[has_title], budget=incr.Budget(max_attempts=2), version="1")
    def summary(key, *, previous=None, feedback=()):
        return f"draft {len(feedback)} about {topic.get()}"     # never learns: it fails

    @incr.cell(version="1")
    def headline():
        return topic.get().upper()

    with rt:
        print(headline())
        try:
            summary("k")
        except incr.NotAccepted as e:
            print(f"not accepted: {e.reason}")
    rt.close()
''')
SECOND_DEPS = {("topic", "summary('k')"), ("topic", "headline()")}


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return e


def incr_cmd(*args, **kw):
    return subprocess.run([sys.executable, "-m", "incr.cli", *args], capture_output=True,
                          text=True, env=env(), cwd=ROOT, **kw)


class UI:
    """``incr ui STORE --port 0`` in a process of its own; ``url`` from what it prints."""

    def __init__(self, path):
        self.proc = subprocess.Popen([sys.executable, "-m", "incr.cli", "ui", path,
                                      "--port", "0"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("incr ui: http://127.0.0.1:"):
            self.proc.kill()
            raise AssertionError(f"incr ui printed {line!r}: {self.proc.stderr.read()}")
        self.url = line.split()[2]

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def browser():
    pw, b = chromium()
    yield b
    b.close()
    pw.stop()


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "store")
    assert main(["demo", "--store", path, "--json"]) == 0
    assert main(["demo", "--sheet", "--store", path, "--json"]) == 0
    return path


def wait_ready(page, after=0):
    """Until the page has drawn what it read more than ``after`` times (it counts)."""
    page.wait_for_function(f"Number(document.body.dataset.ready || 0) > {after}",
                           timeout=60_000)
    return int(page.evaluate("document.body.dataset.ready"))


def test_live_page_shows_the_trace_and_follows_a_program_writing_to_the_store(
        store, tmp_path, browser):
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed (Debian: apt-get install graphviz)")
    ui = UI(store)
    try:
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        page.goto(ui.url)
        n = wait_ready(page)
        page.check("#actual")
        m = page.evaluate(MEASURE)
        check_drawing(m, SHEET | SQL, SQL_VERDICTS, graph_json(store))
        # the node count matches `incr inspect --json`: its instances are the cells and LLM
        # nodes drawn, its LLM nodes the ones drawn as such
        insp = json.loads(incr_cmd("inspect", store, "--json").stdout)
        drawn = sorted(x["label"] for x in m["nodes"] if x["kind"] in ("cell", "llm"))
        assert drawn == sorted(r["label"] for r in insp["instances"] if not r["superseded"])
        assert sorted(x["label"] for x in m["nodes"] if x["kind"] == "llm") == \
            sorted(r["label"] for r in insp["llm_nodes"])
        assert page.locator("#runs .run").count() == insp["runs"] == 2

        # clicking an LLM node: its verdicts, the NACK's counterexample, the stop reason
        page.locator("#graph g.node", has_text="write_sql('q')").click()
        rows = table_rows(page, "#details table.verdicts")
        assert rows[0] == [["sql_checks", "ACK", "counts_paid", ""],
                           ["sql_checks", "ACK", "excludes_refunds", ""]]
        # (the demo's B: revision 1 misses refunds, revision 2 is a regression, 3 a patch)
        nack = [r for t in rows[1:] for r in t if r[:3] == ["sql_checks", "NACK",
                                                           "excludes_refunds"]]
        assert len(nack) == 1
        assert "expected 1, got 2" in nack[0][3] and "'rows'" in nack[0][3]
        text = page.locator("#details").inner_text()
        assert "accepted: candidate revision 3" in text
        assert "+SELECT COUNT(*) FROM orders WHERE status = 'paid' AND refunded = 0" in text

        # a second program writes to the store while the page is open: it appears, no reload
        prog = tmp_path / "second.py"
        prog.write_text(SECOND)
        p = subprocess.run([sys.executable, str(prog), store], capture_output=True, text=True,
                           env=env(), cwd=ROOT)
        assert p.returncode == 0 and p.stdout.splitlines() == ["REFUNDS", "not accepted: budget"], p.stderr
        page.wait_for_function("""() => [...document.querySelectorAll('#graph g.node text')]
                                  .some(t => t.textContent === "summary('k')")""",
                               timeout=60_000)
        wait_ready(page, n)
        m = page.evaluate(MEASURE)
        check_drawing(m, SHEET | SQL | SECOND_DEPS,
                      SQL_VERDICTS | {("summary('k')", "has_title")}, graph_json(store))
        fill = {x["label"]: x["fill"] for x in m["nodes"]}
        assert fill["summary('k')"] == STATUS_COLOUR["failed"]
        assert page.locator("#runs .run").first.get_attribute("data-run") == "3"
        assert "second.py" in page.locator("#runs .run").first.inner_text()
        assert "headline()" in page.locator("#runs .run").first.inner_text()
        page.locator("#graph g.node", has_text="summary('k')").click()
        text = page.locator("#details").inner_text()
        assert "failed: budget" in text, text
        assert "Last candidate (not accepted)\ndraft 1 about refunds" in text, text
        assert "\nValue\n" not in text, text    # a failed node has no value
        nacks = [r for t in table_rows(page, "#details table.verdicts") for r in t
                 if "NACK" in r]
        assert nacks and all("no '#' title line" in r[-1] for r in nacks), nacks
        if os.environ.get("INCR_UI_SCREENSHOT"):
            page.uncheck("#actual")
            page.locator("#graph g.node", has_text="write_sql('q')").click()
            page.screenshot(path=os.environ["INCR_UI_SCREENSHOT"])
    finally:
        ui.close()


def test_superseded_instances_are_hidden_until_the_toggle(tmp_path, browser):
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed (Debian: apt-get install graphviz)")
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
    ui = UI(path)
    try:
        page = browser.new_page()
        page.goto(ui.url)
        n = wait_ready(page)
        nodes = page.locator("#graph g.node", has_text="top(3)")
        assert nodes.count() == 1 and page.locator("#graph g.node.superseded").count() == 0
        assert page.locator("#nsup").inner_text() == "1"
        page.check("#showall")
        wait_ready(page, n)
        assert nodes.count() == 2 and page.locator("#graph g.node.superseded").count() == 1
        page.locator("#graph g.node.superseded").click()
        assert "Superseded" in page.locator("#details").inner_text()
    finally:
        ui.close()


def test_without_graphviz_the_page_says_what_to_install_and_lists_the_nodes(
        store, tmp_path, browser, monkeypatch):
    from incr import ui as ui_mod
    monkeypatch.setenv("PATH", str(tmp_path))          # no `dot` on it
    server = ui_mod.serve(store, 0)
    try:
        page = browser.new_page()
        page.goto(server.url)
        wait_ready(page)
        msg = page.locator("#nodot").inner_text()
        assert "Graphviz's `dot`" in msg and "apt-get install graphviz" in msg
        g = graph_json(store)
        assert page.locator("#nodot button").count() == len(g["nodes"])
        page.locator("#nodot button", has_text="write_sql('q')").click()
        assert "sql_checks" in page.locator("#details").inner_text()
    finally:
        server.shutdown()
        server.server_close()


def test_ui_on_a_missing_store_or_a_taken_port_says_so(tmp_path):
    p = incr_cmd("ui", str(tmp_path / "nothing"), "--port", "0", timeout=60)
    assert p.returncode == 1 and "there is no incr store" in p.stderr, p.stderr
    assert not os.path.exists(tmp_path / "nothing" / "data.mdb")
    path = str(tmp_path / "s")
    assert main(["demo", "--sheet", "--store", path, "--json"]) == 0
    from incr import ui as ui_mod
    server = ui_mod.serve(path, 0)
    try:
        port = server.server_address[1]
        p = incr_cmd("ui", path, "--port", str(port), timeout=60)
        assert p.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in p.stderr, p.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_ui_answers_only_to_its_own_address(store):
    """A page elsewhere whose name resolves to 127.0.0.1 (DNS rebinding) cannot read the
    store through the user's browser: any other Host is refused."""
    import http.client
    from incr import ui as ui_mod
    server = ui_mod.serve(store, 0)
    try:
        port = server.server_address[1]
        for host, code in ((f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200),
                           (f"evil.example:{port}", 403), ("127.0.0.1", 403)):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.putrequest("GET", "/api/stamp", skip_host=True)
            c.putheader("Host", host)
            c.endheaders()
            r = c.getresponse()
            assert r.status == code, (host, r.status)
            c.close()
    finally:
        server.shutdown()
        server.server_close()


def _get(url):
    import urllib.request
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()


def test_a_snapshot_is_built_once_per_store_state_and_the_page_never_queues_them(
        store, browser, monkeypatch):
    """A large store made small: the snapshot is built once per stamp (served again from
    memory), and while one is being built the page, ticking every second, sends no other
    request (it waits for the answer): the build is held until the page has ticked 3 times."""
    import threading
    from incr import ui as ui_mod
    server = ui_mod.serve(store, 0)
    try:
        builds = ui_mod.builds
        a = _get(server.url + "api/snapshot?all=0")
        b = _get(server.url + "api/snapshot?all=0")
        assert a == b and ui_mod.builds == builds + 1          # the second from memory
        _get(server.url + "api/snapshot?all=1")
        assert ui_mod.builds == builds + 2                     # another view: built
        p = subprocess.run([sys.executable, "-c", SECOND, store], capture_output=True,
                           text=True, env=env(), cwd=ROOT)
        assert p.returncode == 0, p.stderr
        c = _get(server.url + "api/snapshot?all=0")
        assert c != a and ui_mod.builds == builds + 3          # the store changed: rebuilt

        hold, held = threading.Event(), threading.Event()
        calls = []
        real = ui_mod._read

        def slow(*args):
            calls.append(args)
            held.set()
            assert hold.wait(120)
            return real(*args)
        monkeypatch.setattr(ui_mod, "_read", slow)
        monkeypatch.setattr(ui_mod, "_built", {})               # the next request builds
        requests = []
        page = browser.new_page()
        page.on("request", lambda r: requests.append(r.url[len(server.url):]))
        page.goto(server.url)
        assert held.wait(60)
        page.wait_for_function("Number(document.body.dataset.ticks || 0) >= 4",
                               timeout=60_000)
        assert [r for r in requests if r.startswith("api/")] == \
            ["api/stamp", "api/snapshot?all=0"], requests
        hold.set()
        wait_ready(page)
        assert len(calls) == 1
        page.close()
    finally:
        hold_set = locals().get("hold")
        if hold_set is not None:
            hold_set.set()
        server.shutdown()
        server.server_close()


def test_above_max_layout_the_page_lists_the_nodes(store, browser):
    from incr import ui as ui_mod
    g = graph_json(store)
    server = ui_mod.serve(store, 0, max_layout=len(g["nodes"]) - 1)
    try:
        page = browser.new_page()
        page.goto(server.url)
        wait_ready(page)
        msg = page.locator("#nodot").inner_text()
        assert f"{len(g['nodes'])} nodes are more than" in msg and "--max-layout" in msg
        assert page.locator("#nodot button").count() == len(g["nodes"])
        labels = page.locator("#nodot button").all_inner_texts()
        initials = [t.split(": ", 1)[1][0].lower() for t in labels]
        assert initials == sorted(initials), labels                   # sorted by name
        page.fill("#filter", "write_sql")
        assert page.locator("#nodot button:visible").all_inner_texts() == ["llm: write_sql('q')"]
        page.fill("#filter", "")
        assert page.locator("#nodot button:visible").count() == len(g["nodes"])
        page.locator("#nodot button", has_text="write_sql('q')").click()
        assert "sql_checks" in page.locator("#details").inner_text()
    finally:
        server.shutdown()
        server.server_close()
    html = os.path.join(os.path.dirname(store), "page.html")
    assert main(["graph", store, "--format", "html", "--max-layout", "3", "-o", html]) == 0
    with open(html, encoding="utf-8") as f:
        text = f.read()
    assert "nodes are more than" in text and "<svg" not in text.split("<script", 1)[0]


def test_on_a_large_store_details_are_read_when_a_node_is_clicked(store, browser):
    """Above lazy_details nodes (here 0: every store is large) the snapshot leaves the details
    out and the page asks for a node's on click: the same verdicts as the full page shows."""
    from incr import ui as ui_mod
    server = ui_mod.serve(store, 0, lazy_details=0)
    try:
        snap = json.loads(_get(server.url + "api/snapshot?all=0"))
        assert snap["lazy_details"] is True and snap["details"] == {}
        g = snap["graph"]
        llm = next(i for i, n in g["nodes"].items() if n["label"] == "write_sql('q')")
        page = browser.new_page()
        page.goto(server.url)
        wait_ready(page)
        page.locator(f'[id="{llm}"]').first.click()
        page.wait_for_selector(f'#details[data-id="{llm}"]', timeout=60_000)
        text = page.locator("#details").inner_text()
        assert "sql_checks" in text and "Verdicts on the current candidate" in text
        missing = json.loads(_get(server.url + "api/details?all=0&id=nope"))
        assert "not in the store's trace" in missing["error"]
    finally:
        server.shutdown()
        server.server_close()
