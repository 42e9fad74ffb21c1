"""Run a small incr program in a fresh Python process and read back what it did.

A program is the text of its body: it declares inputs on ``rt`` (a Runtime on the store given
on the command line), defines cells that append their name to ``ran`` when they run, and sets
``values`` (anything JSON can carry). The harness adds a prelude and an epilogue that print one
JSON line: ``values``, ``ran`` (every function execution, in order), ``rt.stats()`` and the
warnings the program raised (category name and message).

Each call writes the program text to a file first, so two calls with different text are two
versions of the same program (the cells keep their module and qualified name: ``__main__.f``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PRELUDE = '''\
import json, math, os, sys, warnings
import incr

STORE = sys.argv[1]
P = json.loads(sys.argv[2])
ran = []
caught = []
warnings.simplefilter("always")


def _record_warning(message, category, filename, lineno, file=None, line=None):
    caught.append([category.__name__, str(message)])


warnings.showwarning = _record_warning
rt = incr.Runtime(store=STORE, hash=P.get("hash", "xxh3_128"))
values = None
# ---- program body ----
'''

EPILOGUE = '''
# ---- epilogue ----
_out = {"values": values, "ran": ran, "stats": rt.stats(), "warnings": caught}
rt.close()
sys.stdout.write("\\nRESULT " + json.dumps(_out) + "\\n")
'''


def program_text(body: str) -> str:
    return PRELUDE + textwrap.dedent(body) + EPILOGUE


def run_program(workdir, body: str, store, params=None, name="prog.py", timeout=60):
    """Run ``body`` (see the module doc) once in a new process; return its result dict."""
    path = os.path.join(os.fspath(workdir), name)
    with open(path, "w") as f:
        f.write(program_text(body))
    proc = subprocess.run(
        [sys.executable, path, os.fspath(store), json.dumps(params or {})],
        capture_output=True, text=True, timeout=timeout, cwd=os.fspath(workdir))
    if proc.returncode != 0:
        raise AssertionError(
            f"program exited with {proc.returncode}\n--- stdout\n{proc.stdout}\n"
            f"--- stderr\n{proc.stderr}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"no RESULT line\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
