# The store inside the engine: adopt a stored trace instead of running (probe_step: a small
# state machine kept on the instance's Persist, stepped from the verification stack), and
# record a run for the store (record, flushed once per top-level demand or pass by flush).
# Records are read and written by incr._codec; the index layout is in incr/store.py.
#
# Invariants kept:
#   - a damaged record, index node or argument encoding is a miss, never a value (and is
#     reported: a warning, or store.damaged_record); nothing is unpickled or evaluated;
#   - a stored trace is adopted only if every recorded dependency resolves to a node of this
#     process and hashes as recorded (inputs by name, cells by identity and instance key);
#     adoption sets value, edges (I3) and timestamps (I4) as a run would, with A_LOADED;
#   - lookup state is empty outside a lookup: Persist.cands, resolved and node are None once
#     probe_step ends (a match, no match, or an exception: ensure clears them);
#   - an F_INVALID (withdrawn) instance is never taken from the store.


cdef int probe_step(Runtime rt, Instance m, list stack) except -1:
    # Find m's stored trace that matches its current dependencies by walking the store's
    # index (incr/store.py): from the root node of m's instance key, each node names the
    # next dependency the traces through it read; that dependency is brought up to date
    # (a cell is pushed on the explicit stack, so a warm start never recurses) and its
    # value hash chooses the next node, until a node names the entry. The cost depends on
    # the dependencies read, not on how many traces are stored. The entry's record is then
    # checked against what was walked (the index is only a guide: never trusted for a
    # value), and adopted.
    cdef Persist p = m.persist
    cdef Node d
    cdef Record rec
    cdef bytes v
    cdef Py_ssize_t i
    if p is None:
        p = persist_of(rt, m)
    if not p.ok:
        return NOMATCH
    if p.cands is None:
        p.cands = []           # (not None: a lookup runs)
        p.miss = None
        p.node = _INDEX_ROOT
        p.di = 0
        p.resolved = []
    while p.node is not None:
        if len(p.resolved) > p.di:
            d = <Node>p.resolved[p.di]   # pushed for verification; back now
        else:
            try:
                v = index_node(rt, p.ikey + p.node)
                if v is None:
                    if p.di:
                        # stored runs exist, and none read this value of the last dependency
                        p.miss = _node_label(<Node>p.resolved[p.di - 1])
                    return no_match(rt, p)
                x = index_choose(rt, p.ikey, v)
                if isinstance(x, Record):    # every dependency matched: the entry
                    p.cands.append(x)
                    p.node = None
                    break
                d = <Node>x
            except ValueError as e:
                _warn(f"incr store {rt.store_path}: damaged index node "
                      f"{(p.ikey + p.node).hex()[:16]}… ignored ({e}); the value will be "
                      f"recomputed", DamagedRecordWarning)
                return no_match(rt, p)
            except Exception as e:
                _warn(f"incr store {rt.store_path}: lookup failed ({e}); computing "
                      f"{m.label()}", DamagedRecordWarning)
                return no_match(rt, p)
            if d is None:
                return no_match(rt, p)
            p.resolved.append(d)
        if d.flags & F_AHEAD:
            # runs ahead in this pass: m waits with it; its lookup starts again then
            p.cands = None
            p.resolved = None
            p.node = None
            m.flags |= F_AHEAD
            rt.ahead_marked.append(m)
            return DONE
        if isinstance(d, Instance) and _needs_work(d) and not (
                not (d.flags & F_HAS_VALUE) and d in rt.failed):
            # (an instance that failed in this pass is not pushed again: a mismatch)
            if d.flags & (F_VERIFYING | F_RUNNING):
                return no_match(rt, p)
            d.flags |= F_VERIFYING
            stack.append(d)      # (its walk_at is 0: it is on no stack)
            return PUSHED
        if not (d.flags & F_HAS_VALUE) or not value_hash(rt, d):
            return no_match(rt, p)
        if isinstance(d, Input):
            p.node = _index_step(p.node, b"i", (<Input>d).name.encode("utf-8"), d.vhash)
        else:
            p.node = _index_step(p.node, b"c", (<Instance>d).persist.ikey, d.vhash)
        p.di += 1
    rec = <Record>p.cands[0]
    resolved = p.resolved
    if rec.ndeps != len(resolved):
        return no_match(rt, p)
    for i in range(rec.ndeps):
        d = <Node>resolved[i]
        if not _dep_names(rec, i, d) or not _blob_equals(rec.data, _dep_hash_at(rec, i),
                                                         d.vhash):
            return no_match(rt, p)
    if m.cell.is_llm:
        # a candidate withdrawn by evidence (or a node not stable) is not taken back
        from incr import llmnodes as _llm
        if not _llm._may_adopt(rt, m, _blob_bytes(rec.data, rec.vh_at)):
            return no_match(rt, p)
    p.cands = None
    p.resolved = None
    try:
        adopt(rt, m, rec, resolved)
    except _keys.DecodeError as e:
        _warn(f"incr store {rt.store_path}: the stored value of "
              f"{m.label()} does not decode ({e}); recomputing",
              DamagedRecordWarning)
        rt.n_store_misses += 1
        return NOMATCH
    return DONE


cdef int no_match(Runtime rt, Persist p):
    p.cands = None
    p.resolved = None
    p.node = None
    rt.n_store_misses += 1
    return NOMATCH


cdef object index_node(Runtime rt, bytes key):
    # the index node at key, or None: committed (in the pass's read transaction), with
    # what waits for the next commit (durability="group") first
    iops = _pass_iops(rt.store)
    v = iops[1]() if iops[0](key) else None
    pending = <dict>rt.store.pending_index
    if pending:
        items = pending.get(key)
        if items is not None:
            return _index_merge(v, items)
    return v


cdef tuple _pass_iops(object store):
    # store._iops for this thread's pass (see Store.pass_ops and pass_cursor). The common
    # cases without a Python call: the pass is this thread's and not parked (no other thread
    # ends it then), or parked by this thread and younger than the interval (unparked here
    # under the store's lock, as Store._unpark does); anything else goes through pass_ops,
    # which unparks it, ends it, or begins a new one. (The store's plain attributes are read
    # from its __dict__: the same values, without a type lookup each.)
    cdef dict d = <dict>PyObject_GenericGetDict(store, NULL)
    cdef object me = PyThread_get_thread_ident()
    if d.get("_pass_thread") == me:
        if d.get("_parked") is False:
            iops = d.get("_iops")
            if iops is not None:
                return <tuple>iops
        else:
            lk = d["_lk"]
            if lk.acquire(False):
                try:
                    if (d.get("_parked") is True and d.get("_pass_thread") == me
                            and _monotonic() - d["_pass_began"] <= d["interval"]):
                        iops = d.get("_iops")
                        if iops is not None:
                            d["_parked"] = False
                            return <tuple>iops
                finally:
                    lk.release()
    if store.pass_ops is None:
        store.pass_cursor()
    return <tuple>store._iops


cdef Record index_entry(Runtime rt, bytes ikey, bytes key):
    # the sound record of the entry `key` (of ikey), or None; a damaged one is reported
    # to the store (a warning now, replaced at the next commit)
    cdef Py_ssize_t n = len(ikey)
    if len(key) <= n or memcmp(PyBytes_AS_STRING(key), PyBytes_AS_STRING(ikey), n) != 0:
        raise ValueError("it names an entry of another instance")
    data = (<dict>rt.store.pending).get(key)   # (waits for the next commit)
    if data is None:
        iops = <tuple>rt.store._iops
        if not iops[2](key):
            return None            # dropped by gc
        data = iops[3]()
    try:
        return _read_record(key, data)
    except ValueError as e:
        rt.store.damaged_record(key, str(e))
        return None


cdef object index_choose(Runtime rt, bytes ikey, bytes v):
    # What the index node v leads to: its alternatives (most recently written first) are
    # the next dependency read (b"i" blob(name) | b"c" blob(identity) blob(args)
    # blob(instance key)) or the entry (b"E" blob(entry key)); the first that names a
    # node of this process (a dependency), or a sound entry (a Record), is taken; None if
    # none does. ValueError if v is damaged. (After a dependency's code was edited, the
    # node holds both identities: only the live one resolves.)
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(v)
    cdef Py_ssize_t n = len(v), at = 0, a, b, c, end
    cdef unsigned char kind
    if n == 0:
        raise ValueError("an empty index node")
    while at < n:
        kind = p[at]
        if at + 5 > n:
            raise ValueError("an index node's item is cut short")
        a = at + 1                          # the first blob
        end = a + 4 + _u32(p + a)
        if end > n:
            raise ValueError("a blob overruns the index node")
        if kind == 0x63:                    # 'c': two more blobs
            b = end
            if b + 4 > n:
                raise ValueError("a blob overruns the index node")
            c = b + 4 + _u32(p + b)
            if c + 4 > n:
                raise ValueError("a blob overruns the index node")
            end = c + 4 + _u32(p + c)
            if end > n:
                raise ValueError("a blob overruns the index node")
            d = resolve_cell(rt, v[a + 4:b].decode("utf-8", "strict"), v, b)
            if d is not None:
                return d
        elif kind == 0x69:                  # 'i'
            d = rt.inputs.get(PyUnicode_DecodeUTF8(<const char *>p + a + 4, end - a - 4,
                                                   "strict"))
            if d is not None:
                return d
        elif kind == 0x45:                  # 'E'
            rec = index_entry(rt, ikey, v[a + 4:end])
            if rec is not None:
                return rec
        else:
            raise ValueError("an unknown kind of index item")
        at = end
    return None


cdef void adopt(Runtime rt, Instance m, Record rec, list resolved) except *:
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(rec.data)
    value = _decode_at(rec.data, rec.val_at + 4, _u32(p + rec.val_at))
    cdef bint had = (m.flags & F_HAS_VALUE) != 0
    if had and _same_value(m.value, value):
        pass  # same value: dependents are not disturbed
    else:
        m.value = value
        m.changed_at = rt.clock
        m.changed_rev = rt.revision
    m.vhash = _blob_bytes(rec.data, rec.vh_at)
    rewire(rt, m, m.deps, resolved)
    m.verified_at = rt.clock
    m.ran_rev = rt.revision
    m.flags = (m.flags | F_HAS_VALUE) & ~F_DIRTY
    m.last_action = A_LOADED
    raise_ts(rt, m)
    _add_usage_tag(rt.store.hit_tags, rec.key)
    rt.n_store_hits += 1
    rt.n_reused += 1
    if rt.report_log is not None:
        log_run(rt.report_log, m, A_LOADED)     # (flat: _core_execute.pxi)


cdef Node resolve(Runtime rt, Record rec, Py_ssize_t i):
    # The node dependency i of rec names in this process, or None. A cell dependency is
    # named by its cell identity and arguments, and its instance key, which must agree.
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(rec.data)
    cdef Py_ssize_t at = rec.deps_at[i]
    cdef Py_ssize_t args_at, args_n
    cdef Cell c
    cdef Instance n
    name = _rec_str(rec, _u32(p + at + 1))
    if p[at] == 0x69:   # 'i'
        return rt.inputs.get(name)
    return resolve_cell(rt, name, rec.data, at + 5)


cdef Node resolve_cell(Runtime rt, str name, bytes data, Py_ssize_t args_at):
    # The instance named by cell identity `name` and the blobs at args_at in data: its
    # canonical arguments, then its instance key, which must agree; or None.
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t args_n = _u32(p + args_at)
    cdef Cell c
    cdef Instance n
    co = _stored_cells.get(name, _stored_cells)
    if co is _stored_cells:
        co = _keys.stored_cell(name)
    if co is None:
        return None
    c = <Cell>co
    args = _decode_simple(data, args_at + 4, args_n)
    if args is _NOT_SIMPLE:
        args = _stored_args(rt, data[args_at + 4:args_at + 4 + args_n])
        if args is None:
            return None
    elif type(args) is not tuple:
        return None
    try:
        n = lookup(rt, c, table_for(rt, c), args, True)
    except TypeError:
        return None
    if n.persist is None:
        # its persistent identity is the reference we resolved: no need to re-encode
        persist_with(rt, n, name, _blob_bytes(data, args_at))
    if not n.persist.ok or not _blob_equals(data, args_at + 4 + args_n, n.persist.ikey):
        return None   # the record does not agree with itself: not this instance
    return n


cdef bint _dep_names(Record r, Py_ssize_t i, Node d):
    # whether dependency i of r names d: an input by its name, a cell by its instance key
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(r.data)
    cdef Py_ssize_t at = r.deps_at[i]
    if p[at] == 0x69:   # 'i'
        return isinstance(d, Input) and _rec_str(r, _u32(p + at + 1)) == (<Input>d).name
    if not isinstance(d, Instance) or (<Instance>d).persist is None:
        return False
    at += 5
    at += 4 + _u32(p + at)        # past the arguments: the instance key
    return _blob_equals(r.data, at, (<Instance>d).persist.ikey)


cdef object _stored_args(Runtime rt, bytes data):
    # stored argument bytes decoded by the general decoder, with this runtime's inputs in
    # place of input references; None if they do not decode to a tuple or name an unknown input
    try:
        args = _keys.decode(data)
    except _keys.DecodeError:
        return None
    if type(args) is not tuple:
        return None
    return _with_inputs(rt, <tuple>args)


cdef object _with_inputs(Runtime rt, tuple args):
    # decoded arguments with input references replaced by this runtime's inputs; None if one
    # is not declared here
    cdef bint refs = False
    for a in args:
        if isinstance(a, _InputRef):
            refs = True
            break
    if not refs:
        return args
    out = []
    for a in args:
        if isinstance(a, _InputRef):
            a = rt.inputs.get(a)
            if a is None:
                return None
        out.append(a)
    return tuple(out)


cdef Persist persist_of(Runtime rt, Instance n):
    cdef Persist p
    ident = _cell_ident(n.cell)
    if ident is None:
        _warn_once(n.cell, f"incr: {n.cell.name} shares its identity with another live "
                           f"cell, so neither is stored; give them distinct version=")
    else:
        try:
            args = _encode_simple(n.args)     # the common argument tuple, in place
            if args is None:
                args = _keys.encode(n.args)
            return persist_with(rt, n, ident, args)
        except TypeError as e:
            _warn_once(n.cell, f"incr: arguments of {n.label()} cannot be stored ({e})")
    p = Persist()
    n.persist = p
    return p


cdef object _cell_ident(Cell c):
    # keys.cell_identity(c): an exact identity is fixed once known (keys caches it on the
    # cell), so it is read from there without a call; an inexact one depends on the other
    # live cells and is asked every time
    cdef dict d = <dict>PyObject_GenericGetDict(c, NULL)
    if d.get("_incr_exact") is True:
        ident = d.get("_incr_ident")
        if type(ident) is str:
            return ident
    return _keys.cell_identity(c)


cdef Persist persist_with(Runtime rt, Instance n, str ident, bytes args):
    # n's persistent identity, set
    cdef Persist p = Persist.__new__(Persist)
    p.ident = ident
    p.args = args
    p.ikey = _instance_key(ident, args, rt.hash)
    p.ok = True
    n.persist = p
    return p


cdef object value_hash(Runtime rt, Node n):
    if n.vhash is None:
        try:
            n.vhash = _digest("value", b"V", _encode_value(n.value), rt.hash)
        except TypeError:
            n.vhash = b""
    return n.vhash


cdef bytes _encode_value(object value):
    # keys.encode_value(value): the common kinds in place
    b = _encode_simple(value)
    if b is None:
        return _keys.encode_value(value)
    return b


cdef void record(Runtime rt, Instance n) except *:
    # Store n's value with the content hashes of the dependencies it read: a constructive
    # trace keyed by its immediate dependencies, so cutoff holds across processes.
    cdef Persist p = n.persist
    if p is None:
        p = persist_of(rt, n)
    if not p.ok:
        return
    try:
        val = _encode_value(n.value)
    except TypeError as e:
        n.vhash = b""
        _warn_once(n.cell, f"incr: the value of {n.label()} cannot be stored, so it stays "
                           f"in memory only ({e})")
        return
    n.vhash = _digest("value", b"V", val, rt.hash)
    # the references, with instance keys, as the record holds them; the trace hash is
    # taken of them without the instance keys (see refs)
    cdef list stored = _stored_refs(rt, n.deps)
    if stored is None:
        return  # it read something that cannot be named or hashed: nothing to verify it by
    pre = _trace_bytes(stored)
    if pre is None:
        pre = _msgpack.packb(refs(rt, n.deps), use_bin_type=True)
    entry = p.ikey + _digest("trace", b"T", pre, rt.hash)
    rt.store.put(entry, _pack_record(p.ident, n.label(), p.args, val, n.vhash, stored,
                                     rt.store.run),
                 _index_nodes(p.ikey, entry, stored))


cdef list _stored_refs(Runtime rt, object nodes):
    # ("i", name, value hash) or ("c", identity, args, instance key, value hash) naming each
    # node, as a record holds them, or None if one cannot be named or hashed
    cdef Node d
    cdef Persist dp
    cdef list out = []
    for d in nodes:
        if not (d.flags & F_HAS_VALUE):
            return None
        h = value_hash(rt, d)
        if not h:
            return None
        if isinstance(d, Input):
            out.append(("i", (<Input>d).name, h))
        else:
            dp = (<Instance>d).persist
            if dp is None:
                dp = persist_of(rt, <Instance>d)
            if not dp.ok:
                return None
            out.append(("c", dp.ident, dp.args, dp.ikey, h))
    return out


cdef list refs(Runtime rt, object nodes, list stored=None):
    # [kind, ref, value hash] naming each node (and, into ``stored``, the same with
    # instance keys, as a record holds them), or None if one cannot be named or hashed
    cdef Node d
    cdef Persist dp
    out = []
    for d in nodes:
        if not (d.flags & F_HAS_VALUE):
            return None
        h = value_hash(rt, d)
        if not h:
            return None
        if isinstance(d, Input):
            out.append(["i", (<Input>d).name, h])
            if stored is not None:
                stored.append(("i", (<Input>d).name, h))
        else:
            dp = (<Instance>d).persist
            if dp is None:
                dp = persist_of(rt, <Instance>d)
            if not dp.ok:
                return None
            out.append(["c", [dp.ident, dp.args], h])
            if stored is not None:
                stored.append(("c", dp.ident, dp.args, dp.ikey, h))
    return out


cdef void flush(Runtime rt, bint quiet) except *:
    # the end of a top-level demand or pass: commit now ("sync") or within the group
    # interval ("group", see Store.commit_due)
    if _group_defer(rt.store):
        return
    if quiet:
        try:
            rt.store.commit_due()
        except Exception:
            pass
    else:
        rt.store.commit_due()


cdef bint _group_defer(object s) except -1:
    # Store.commit_due's common case under durability="group", without a Python call: this
    # thread's pass is parked for its next demand, and what is buffered waits for the commit
    # thread (the interval has not run out, nor the records or bytes). True when done; False
    # when commit_due must decide (a commit is due, a first result, another thread waits...).
    # (Plain attributes read from the store's __dict__, as in _pass_iops.)
    cdef dict d = <dict>PyObject_GenericGetDict(s, NULL)
    if d.get("durability") != "group" or d.get("_bg_error") is not None or d.get("_draining"):
        return False
    since = d.get("_since")
    if (since is None or d.get("reader") is None
            or d.get("_pass_thread") != PyThread_get_thread_ident()):
        return False
    now = _monotonic()
    interval = d["interval"]
    if (now - d["_pass_began"] > interval or now - since >= interval
            or len(<dict>d["pending"]) >= d["group_records"]
            or d["_pending_bytes"] >= d["group_bytes"]):
        return False
    d["_parked"] = True
    return True
