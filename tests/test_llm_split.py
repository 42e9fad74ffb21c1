"""The split of incr/llmnodes.py (issue 11): incr.llmnodes stays the face every caller uses, the
private incr/_llm_*.py modules import only lower ones, and incr/errors.py imports nothing of
incr (the old circle errors -> llmnodes -> store -> errors)."""

import ast
import pickle
import re
from pathlib import Path

import incr
from incr import keys, llmnodes

SRC = Path(incr.__file__).parent
# lowest first: a module may import only the ones before it
ORDER = ["_llm_types", "_llm_book", "_llm_ledger", "_llm_report", "_llm_store", "_llm_calls",
         "_llm_loop", "llmnodes"]


def _incr_imports(path: Path) -> list[tuple[str, bool]]:
    """(incr module, imported at module level) for every import of an incr module in ``path``."""
    out = []
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "incr":
                mods = [a.name for a in node.names]
            elif node.module.startswith("incr."):
                mods = [node.module.split(".")[1]]
            else:
                continue
            out.extend((m, id(node) in top) for m in mods)
        elif isinstance(node, ast.Import):
            out.extend((a.name.split(".")[1], id(node) in top) for a in node.names
                       if a.name.startswith("incr."))
    return out


def test_errors_imports_nothing_of_incr():
    assert _incr_imports(SRC / "errors.py") == []


def test_the_llm_modules_import_only_lower_ones_and_only_at_the_top():
    for i, name in enumerate(ORDER):
        for mod, at_top in _incr_imports(SRC / f"{name}.py"):
            if mod.startswith("_llm_") or mod == "llmnodes":
                assert mod in ORDER[:i], f"{name} imports {mod}, which is not lower"
                assert at_top, f"{name} imports {mod} inside a function"


def test_every_name_the_core_calls_is_on_llmnodes():
    names = set()
    for f in list(SRC.glob("*.pyx")) + list(SRC.glob("*.pxi")) + [SRC / "_aio.py"]:
        names |= set(re.findall(r"\b_llm\.([A-Za-z_]\w*)", f.read_text()))
        names |= set(re.findall(r"\bllmnodes\.([A-Za-z_]\w*)", f.read_text()))
    assert {"state", "outside_verdict", "_evidence", "_may_adopt", "_absorb_reject"} <= names
    missing = sorted(n for n in names if not hasattr(llmnodes, n))
    assert missing == []


def test_names_imported_from_llmnodes_outside_it_are_still_there():
    for name in ("ACK", "NACK", "UNKNOWN", "Acceptance", "Budget", "Candidate", "NodeState",
                 "Validator", "effect", "llm", "validator", "audits", "summaries",
                 "_unpack_node", "msgpack_label", "_instance", "_transient", "_node_of",
                 "_Loop", "FailureReport", "pass_reset", "stabilization_begins", "time"):
        assert hasattr(llmnodes, name), name


def test_the_public_classes_keep_their_module_so_pickles_and_closure_identities_hold():
    for cls in (incr.ACK, incr.NACK, incr.UNKNOWN, incr.Acceptance, incr.Budget,
                incr.Candidate, incr.NodeState, llmnodes.Validator, llmnodes.FailureReport):
        assert cls.__module__ == "incr.llmnodes", cls
        assert getattr(llmnodes, cls.__qualname__) is cls
    b = pickle.loads(pickle.dumps(incr.Budget(max_tokens=10)))
    assert b == incr.Budget(max_tokens=10)
    assert pickle.loads(pickle.dumps(incr.NACK("c", [1], "m"))) == incr.NACK("c", [1], "m")
    # a closure over a value the codec cannot encode is named by its type's module: the one
    # it had before the split
    budget = incr.Budget()

    def fn():
        return budget
    changed = keys.closure_fingerprint(fn)
    assert changed[1] is False
    llmnodes.Budget.__module__ = "incr._llm_types"
    try:
        assert keys.closure_fingerprint(fn) != changed
    finally:
        llmnodes.Budget.__module__ = "incr.llmnodes"
