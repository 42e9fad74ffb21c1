# Explain: what the engine says about itself -- explain() (why an instance ran, or why it is
# up to date), and check() (Runtime._check(): every invariant of _core.pxd, I1-I7, O(trace);
# for tests, never called by production code).
#
# Contract: nothing here changes the trace (explain and _check read only; evidence for I7
# comes from incr.llmnodes._evidence).


def _stale_evidence(Runtime rt, Instance n):
    # I7 for a clean LLM node instance: its state holds the stable candidate, and nothing its
    # acceptance rests on (what incr.llmnodes recorded as read before each verdict on the
    # current revision) changed or was withdrawn since without n being verified again
    cdef Node d
    from incr import llmnodes as _llm
    own, basis = _llm._evidence(rt, n)
    out = [f"I7: {n.label()} {p}" for p in own]
    for what, d, at in basis:
        if d.changed_at != at or _needs_work(d) or d.flags & F_INVALID:
            out.append(f"I7: {n.label()} is clean, but {what} was made under "
                       f"{_node_label(d)} as of tick {at}, which has since "
                       f"{'changed (tick ' + str(d.changed_at) + ')' if d.changed_at != at else 'been withdrawn or made stale'}"
                       f" without {n.label()} being verified again")
    return out


cdef str _node_label(Node d):
    if isinstance(d, Instance):
        return (<Instance>d).label()
    return f"input {(<Input>d).name!r}"


def _explain(Runtime rt, Instance n):
    cdef Node w
    lab = n.label()
    if n.flags & F_DIRTY:
        tail = (f"; it is stale now (a dependency changed after revision {n.ran_rev}) and "
                f"will be checked at its next demand")
    else:
        tail = ""
    act = n.last_action
    if act == A_NONE:
        return f"{lab} has never been computed on this runtime"
    if act == A_FAILED:
        return f"{lab} raised on its last run, at revision {n.ran_rev}; it runs again at its next demand"
    if act == A_LOADED:
        text = (f"{lab} was taken from the store at revision {n.ran_rev}: the dependencies it "
                f"read hash the same as when it was stored, so it did not run")
    elif act == A_COMPUTED:
        if n.persist is not None and n.persist.miss is not None:
            text = (f"{lab} was computed at revision {n.ran_rev}: the store holds earlier runs "
                    f"of it, but {n.persist.miss} changed since the stored run (no stored run "
                    f"read its current value)")
        else:
            text = f"{lab} was computed for the first time at revision {n.ran_rev}"
    elif act in (A_RECOMPUTED, A_CUTOFF):
        w = n.why
        if w is None:
            cause = "its previous run had failed"
        elif w is n:
            cause = "its previous value was withdrawn (a NACK against the candidate it held)"
        elif not (w.flags & F_HAS_VALUE):
            cause = f"{_node_label(w)} had failed"
        else:
            cause = f"{_node_label(w)} changed at revision {w.changed_rev}"
        text = f"{lab} was recomputed at revision {n.ran_rev} because {cause}"
        if act == A_CUTOFF:
            text += (f"; the new value equals the old one (cutoff), so its dependents were not "
                     f"disturbed and it counts as unchanged since revision {n.changed_rev}")
    else:
        text = (f"{lab} was reused: verified at revision {rt.revision} with no dependency "
                f"changed since its last run at revision {n.ran_rev}")
    deps = ", ".join(_node_label(d) for d in n.deps)
    if deps:
        text += f". It read: {deps}"
    return text + tail


cdef object check(Runtime rt):
    # Runtime._check(): every invariant of _core.pxd (I1-I7), O(trace); AssertionError naming
    # each broken one. For tests: production code never calls it.
    cdef Instance n
    cdef Node d
    from collections import Counter
    problems = []
    if rt.frames:
        problems.append("I6: frames left on the stack")
    if rt.ahead_marked and not rt.stabilizing:
        problems.append("I6: instances left marked to run ahead after a pass")
    dependents_of = {}
    all_nodes = list(rt.inputs.values()) + rt._instances()
    dirty_obs = {id(x) for x in rt.dirty_observed}
    for node in all_nodes:
        if isinstance(node, Instance):
            n = node
            lab = n.label()
            if n.flags & (F_RUNNING | F_VERIFYING):
                problems.append(f"I6: {lab} is marked running or verifying")
            if n.flags & F_AHEAD and not rt.stabilizing:
                problems.append(f"I6: {lab} is still marked to run ahead (F_AHEAD)")
            for d in n.deps:
                dependents_of.setdefault(id(d), Counter())[id(n)] += 1
                if (n.flags & (F_DIRTY | F_HAS_VALUE)) == F_HAS_VALUE and (d.flags & F_DIRTY):
                    problems.append(f"I1: {lab} is not dirty but its dependency "
                                    f"{_node_label(d)} is")
                if not _needs_work(n) and d.changed_at > n.verified_at:
                    problems.append(f"I2: {lab} is clean but {_node_label(d)} changed at "
                                    f"{d.changed_at} after its verification {n.verified_at}")
                if d.ts >= n.ts:
                    problems.append(f"I4: {lab} (ts {n.ts}) reads {_node_label(d)} "
                                    f"(ts {d.ts})")
            if n.observed_by is not None and _needs_work(n) and id(n) not in dirty_obs:
                problems.append(f"I5: observed {lab} is dirty or failed but not queued")
            if (n.flags & F_HAS_VALUE) == 0 and n.value is not None:
                problems.append(f"{lab} keeps a value from a failed run")
            if n.cell.is_llm and not _needs_work(n) and rt.llm is not None:
                problems.extend(_stale_evidence(rt, n))
    for node in all_nodes:
        got = Counter(id(x) for x in ((<Node>node).dependents or ()))
        want = dependents_of.get(id(node), Counter())
        if got != want:
            problems.append(f"I3: dependents of {_node_label(node)} do not mirror deps")
    if problems:
        raise AssertionError("trace invariants broken:\n  " + "\n  ".join(problems))
    return True
