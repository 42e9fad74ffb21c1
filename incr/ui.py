"""``incr ui STORE``: the stored trace as a live local web page.

A small HTTP server from the standard library (``http.server``, one thread per request) on
127.0.0.1 serves the page (``incr/ui_page.html``, the same page as ``incr graph --format
html``) and two JSON endpoints:

- ``/api/stamp``: what identifies the store's current state (LMDB's last transaction id); the
  page asks for it every second and, when it moved, for
- ``/api/snapshot?all=0|1``: everything drawn and shown (``incr.graph.snapshot``), with or
  without superseded instances.

Every request opens the store read-only (an LMDB reader: it never writes, never waits for a
writer, and sees the last commit of a program running on the same store), reads one snapshot
and closes it again, so ``incr gc --compact`` is not kept waiting between requests.

Bounded on a large store: a snapshot is built once per store state and view (the latest one
is kept, encoded, and served again to every request for the same stamp: other tabs, the
superseded toggle going back), one at a time; the page asks again only once its last
request is answered, so a program committing continuously makes the page refresh as often
as a snapshot can be built, never queues them. On a store of 10^4 instances a snapshot
takes seconds to read and Graphviz far longer to lay out: above ``graph.MAX_LAYOUT`` nodes
the page lists the nodes instead of drawing them (docs/ui.md has the figures).
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import lmdb

from incr import graph
from incr.errors import StoreError
from incr.store import FORMAT, Store, _begin, _explain


class ReadOnlyStore(Store):
    """A store opened as an LMDB reader: nothing written (not even the run counter), never
    created. The reading methods of ``Store`` work on it (iter_records, iter_nodes, usage,
    programs_usage)."""

    def __init__(self, path: Any):
        super().__init__(path, count_run=False, create=False)

    def _open_env(self, path: str) -> None:
        try:
            env = lmdb.open(path, readonly=True, lock=True, max_dbs=12, subdir=True,
                            readahead=False, max_readers=256)
        except lmdb.Error as e:
            raise _explain(path, e, "opening it to read") from None
        try:
            # (each opened in a read transaction of its own, committed: LMDB shares a handle
            # with later transactions only once the one that opened it has committed)
            for name in ("meta", "entries", "used", "nodes", "log", "index", "runs",
                         "programs", "used_by"):
                setattr(self, name, env.open_db(name.encode(), create=False))
            with _begin(env) as txn:
                fmt = txn.get(b"format", db=self.meta)
                if fmt != str(FORMAT).encode():
                    raise StoreError(f"store {path} has format {(fmt or b'?')[:20]!r}; this "
                                     f"version of incr reads format {FORMAT}")
                self.run = int(txn.get(b"runs", b"0", db=self.meta))
            self.stamp_value = env.info()["last_txnid"]
        except StoreError:
            env.close()
            raise
        except lmdb.NotFoundError:
            env.close()
            raise StoreError(f"store {path} lacks a database of format {FORMAT} (written by "
                             f"another version of incr?)") from None
        except lmdb.Error as e:
            env.close()
            raise _explain(path, e, "reading it") from None
        except ValueError:
            env.close()
            raise StoreError(f"store {path} has a damaged meta record") from None
        self.env = env
        self.pid = os.getpid()


# one reader at a time in this process (LMDB opens an environment once per process)
_lock = threading.Lock()


def stamp(path: str) -> str:
    """What changes whenever a program commits to the store at ``path``."""
    with _lock:
        s = ReadOnlyStore(path)
        try:
            return f"{s.stamp_value}:{s.run}"
        finally:
            s.close()


def read(path: str, all_versions: bool, max_layout: int | None = graph.MAX_LAYOUT) -> dict:
    """``incr.graph.snapshot`` of the store at ``path``, read in one go, with its stamp."""
    with _lock:
        return _read(path, all_versions, max_layout)


def _read(path: str, all_versions: bool, max_layout: int | None) -> dict:
    s = ReadOnlyStore(path)
    try:
        snap = graph.snapshot(s, all_versions=all_versions, max_layout=max_layout)
        snap["stamp"] = f"{s.stamp_value}:{s.run}"
        return snap
    finally:
        s.close()


LAZY_DETAILS = 2000
"""Above this many nodes the snapshot the page fetches leaves the details out (two thirds of
its bytes on a large store); the page asks for one node's when it is clicked."""

# (path, all_versions, max_layout, lazy_details) -> (stamp, the snapshot as JSON, the details
# left out of it or None): the latest one per view
_built: dict[tuple, tuple[str, bytes, dict | None]] = {}
builds = 0      # snapshots built (read from the store) by this process: what the cache saves


def read_json(path: str, all_versions: bool, max_layout: int | None = graph.MAX_LAYOUT,
              lazy_details: int | None = LAZY_DETAILS) -> bytes:
    """The snapshot of the store at ``path`` as JSON bytes, built at most once per store state
    and view: a request for a stamp already built is answered from memory; requests that come
    while one is built wait for it (one build at a time) and then take it if it is theirs.
    Above ``lazy_details`` nodes the details are left out (``lazy_details: true``); they are
    kept for :func:`details_json`."""
    global builds
    with _lock:
        s = ReadOnlyStore(path)
        try:
            now = f"{s.stamp_value}:{s.run}"
        finally:
            s.close()
        view = (path, all_versions, max_layout, lazy_details)
        hit = _built.get(view)
        if hit is not None and hit[0] == now:
            return hit[1]
        snap = _read(path, all_versions, max_layout)
        builds += 1
        kept = None
        if lazy_details is not None and len(snap["graph"]["nodes"]) > lazy_details:
            kept, snap["details"], snap["lazy_details"] = snap["details"], {}, True
        body = json.dumps(snap).encode()
        _built[view] = (snap["stamp"], body, kept)
        return body


def details_json(path: str, all_versions: bool, max_layout: int | None,
                 lazy_details: int | None, node: str) -> dict:
    """The details of one node of the latest snapshot built for that view (the one the page
    shows, or a newer one), or ``{"error": ...}``."""
    with _lock:
        hit = _built.get((path, all_versions, max_layout, lazy_details))
    if hit is None or hit[2] is None:
        return {"error": "no snapshot of this view was read yet; reload the page"}
    d = hit[2].get(node)
    return d if d is not None else {"error": f"{node} is not in the store's trace any more"}


class _Handler(BaseHTTPRequestHandler):
    server_version = "incr-ui"
    store_path = ""
    title = ""
    max_layout: int | None = graph.MAX_LAYOUT
    lazy_details: int | None = LAZY_DETAILS

    def log_message(self, fmt, *args):   # quiet: the terminal shows where the page is
        pass

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, obj: Any, code: int = 200) -> None:
        self._send(code, json.dumps(obj).encode(), "application/json")

    def do_GET(self):
        url = urlsplit(self.path)
        port = self.server.server_address[1]
        if self.headers.get("Host") not in (f"127.0.0.1:{port}", f"localhost:{port}"):
            # another name resolving to this machine (DNS rebinding): a web page elsewhere
            # must not read the store through the user's browser
            self._send(403, b"incr ui answers to http://127.0.0.1:PORT/ only", "text/plain")
            return
        try:
            if url.path in ("/", "/index.html"):
                self._send(200, graph.page(self.title).encode(), "text/html; charset=utf-8")
            elif url.path == "/api/stamp":
                self._json({"stamp": stamp(self.store_path)})
            elif url.path == "/api/snapshot":
                q = parse_qs(url.query)
                self._send(200, read_json(self.store_path, q.get("all", ["0"])[0] == "1",
                                          self.max_layout, self.lazy_details),
                           "application/json")
            elif url.path == "/api/details":
                q = parse_qs(url.query)
                self._json(details_json(self.store_path, q.get("all", ["0"])[0] == "1",
                                        self.max_layout, self.lazy_details,
                                        q.get("id", [""])[0]))
            elif url.path == "/favicon.ico":
                self._send(204, b"", "image/x-icon")
            else:
                self._send(404, b"not found", "text/plain")
        except StoreError as e:
            self._json({"error": str(e)}, 503)


def serve(path: str, port: int = 0, host: str = "127.0.0.1",
          max_layout: int | None = graph.MAX_LAYOUT, lazy_details: int | None = LAZY_DETAILS):
    """Start serving the page of the store at ``path`` in a daemon thread; returns the server
    (its URL: ``server.url``; stop it with ``server.shutdown()``). StoreError if there is no
    store there. ``max_layout``: above that many nodes the page lists them instead of
    drawing them (None: always draw); ``lazy_details``: above that many, a node's details are
    read when it is clicked (None: always in the snapshot)."""
    stamp(path)   # fails now, with the store's message, if there is nothing to show
    handler = type("Handler", (_Handler,), {"store_path": path, "title": path,
                                          "max_layout": max_layout,
                                          "lazy_details": lazy_details})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.url = f"http://{host}:{server.server_address[1]}/"
    t = threading.Thread(target=server.serve_forever, name="incr-ui", daemon=True)
    t.start()
    server.thread = t
    return server
