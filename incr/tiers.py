"""Remote tiers of the store: a content-addressed second tier shared by many machines.

``Runtime(store=".incr", remote="redis://host:6379/0")`` (or ``incr.store.Store(path,
remote=...)``): a lookup that misses in the local store asks the remote tier (read-through),
and what the local store commits is pushed to it in batches by a background thread
(write-behind), flushed at ``close()``. What travels is the store's own records under their
own keys — entries (key = instance key + trace hash), index nodes and LLM node states — so
the remote holds exactly what a local store holds, addressed by content.

A backend is any object with the three methods of :class:`Tier`; :class:`RedisTier` is the
first (``pip install 'incr[redis]'``). An S3-compatible object store would map ``get_many``
to GETs of objects named by the hex of each key and ``put_many`` to PUTs.

Safety: nothing read from a remote is unpickled, unmarshalled or evaluated. incr.store checks
every record it takes from a remote exactly like a local one (header, length, checksum,
layout), and an entry also by content (its value hashes to its value hash, its key is the
hash of its cell, arguments and dependencies); a record that fails is a miss, with one
:class:`RemoteTierWarning`. A remote that is unreachable, slow (past its timeout) or refuses
writes (full) costs one warning per outage and a local computation: it is left alone for
``RETRY_AFTER`` seconds, then tried again. It never raises into the program and never yields
a value the local checks did not pass.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import Counter, deque
from typing import Any, Protocol, runtime_checkable

RETRY_AFTER = 30.0          # seconds a failed remote is left alone before it is tried again
BATCH_ITEMS = 500           # records per put_many of the write-behind thread
BATCH_BYTES = 4 << 20       # ... or bytes
MAX_QUEUE_BYTES = 256 << 20 # records waiting beyond this are dropped (they stay local)
FLUSH_TIMEOUT = 10.0        # seconds close() waits for the write-behind queue
TIMEOUT = 1.0               # Redis socket and connect timeout unless the URL sets one


class RemoteTierWarning(UserWarning):
    """The remote tier could not be used (unreachable, slow, full) or returned a damaged
    record: the value was computed locally (or the record was not pushed)."""


@runtime_checkable
class Tier(Protocol):
    """What a remote backend implements. Keys and values are bytes. Any exception means the
    operation failed (the store then computes locally, with one warning)."""

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The value of each key, None where there is none (one round trip if possible)."""

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        """Store every (key, value) (overwriting: the keys are content addresses)."""

    def close(self) -> None:
        """Release connections."""


class RedisTier:
    """A :class:`Tier` on a Redis server (``redis://``, ``rediss://``, ``unix://`` URLs, as
    redis-py reads them). Keys are ``prefix`` + the record key; values are the records.
    ``timeout`` (seconds) bounds each command unless the URL gives ``socket_timeout``;
    redis-py's retries are off (the store's own back-off applies)."""

    def __init__(self, url: str, *, prefix: bytes = b"incr:3:", timeout: float = TIMEOUT):
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ImportError(f"remote={url!r} needs the redis package: pip install "
                              f"'incr[redis]'") from None
        self.url = url
        self.prefix = prefix
        self.client = redis.Redis.from_url(url, socket_timeout=timeout,
                                           socket_connect_timeout=timeout,
                                           retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
                                           health_check_interval=0)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        p = self.prefix
        return self.client.mget([p + k for k in keys])

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        p = self.prefix
        pipe = self.client.pipeline(transaction=False)
        for k, v in items:
            pipe.set(p + k, v)
        pipe.execute(raise_on_error=True)

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return _redact(self.url)


def _redact(url: str) -> str:
    """``url`` without a password (``redis://:secret@host`` -> ``redis://:***@host``)."""
    head, sep, tail = url.partition("://")
    if sep and "@" in tail:
        cred, _, rest = tail.rpartition("@")
        if ":" in cred:
            cred = cred.split(":", 1)[0] + ":***"
        return f"{head}://{cred}@{rest}"
    return url


def open_tier(remote: Any) -> Tier:
    """The Tier that ``remote=`` names: a URL (``redis://``, ``rediss://``, ``unix://``) or
    an object with get_many, put_many and close."""
    if isinstance(remote, str):
        scheme = remote.partition("://")[0].lower()
        if scheme in ("redis", "rediss", "unix"):
            return RedisTier(remote)
        raise ValueError(f"remote={_redact(remote)!r}: unknown kind of remote tier; incr "
                         f"reads redis://host:port/db (rediss://, unix://), or give an object "
                         f"with get_many, put_many and close (incr.tiers.Tier)")
    if all(callable(getattr(remote, m, None)) for m in ("get_many", "put_many", "close")):
        return remote
    raise TypeError(f"remote must be a URL such as 'redis://127.0.0.1:6379/0' or an object "
                    f"with get_many, put_many and close (incr.tiers.Tier), got "
                    f"{type(remote).__name__}")


class Remote:
    """A tier as the store uses it: reads that never raise, write-behind in batches on a
    background thread, one warning per outage, a back-off, counts (``stats``)."""

    def __init__(self, tier: Tier, name: str | None = None, *,
                 retry_after: float = RETRY_AFTER):
        self.tier = tier
        self.name = name or repr(tier)
        self.retry_after = retry_after
        self.stats: Counter[str] = Counter()
        self._cv = threading.Condition(threading.Lock())
        self._queue: deque[tuple[bytes, bytes]] = deque()
        self._queued_bytes = 0
        self._busy = False              # the writer holds a batch
        self._thread: threading.Thread | None = None
        self._read_down = 0.0           # monotonic time until which reads are not tried
        self._write_down = 0.0          # ... writes
        self._warned_read = False       # this outage was reported (reads / writes)
        self._warned_write = False
        self._warned_damaged = False
        self.closed = False

    # -- health -------------------------------------------------------------------------

    def _failed(self, doing: str, e: BaseException, reads: bool) -> None:
        until = time.monotonic() + self.retry_after
        first = not (self._warned_write if not reads else
                     (self._warned_read or self._warned_write))
        self._write_down = until
        self._warned_write = True
        if reads:
            self._read_down = until
            self._warned_read = True
        self.stats["failures"] += 1
        if first:
            what = ("lookups are computed locally and results stay in the local store"
                    if reads else "results stay in the local store only")
            warnings.warn(f"incr remote tier {self.name}: {doing} failed "
                          f"({type(e).__name__}: {e}); {what}; it is tried again in "
                          f"{self.retry_after:g} s", RemoteTierWarning, stacklevel=2)

    def damaged(self, key: bytes, why: str) -> None:
        """A record read from the remote failed the checks: a miss (warned once)."""
        self.stats["damaged"] += 1
        if not self._warned_damaged:
            self._warned_damaged = True
            warnings.warn(f"incr remote tier {self.name}: damaged record {key.hex()[:18]}… "
                          f"ignored ({why}); computing it locally (it is replaced when "
                          f"pushed again; further damaged records are counted, not reported)",
                          RemoteTierWarning, stacklevel=4)

    # -- reading --------------------------------------------------------------------------

    def get(self, keys: list[bytes]) -> list[bytes | None]:
        """The remote's values of ``keys`` (None where missing, unreachable or malformed)."""
        n = len(keys)
        if not n or self.closed or time.monotonic() < self._read_down:
            return [None] * n
        self.stats["gets"] += n
        self.stats["round_trips"] += 1
        try:
            vals = self.tier.get_many(keys)
            if len(vals) != n:
                raise ValueError(f"{len(vals)} values for {n} keys")
        except Exception as e:
            self._failed("reading", e, reads=True)
            return [None] * n
        self._warned_read = False
        out = [v if isinstance(v, bytes) else None for v in vals]
        self.stats["found"] += sum(v is not None for v in out)
        return out

    # -- writing (behind) -----------------------------------------------------------------

    def push(self, items: list[tuple[bytes, bytes]]) -> None:
        """Queue records for the remote (the writer thread sends them in batches)."""
        if not items or self.closed:
            return
        if time.monotonic() < self._write_down:
            self.stats["dropped"] += len(items)
            return
        with self._cv:
            self._queue.extend(items)
            self._queued_bytes += sum(len(k) + len(v) for k, v in items)
            while self._queued_bytes > MAX_QUEUE_BYTES and self._queue:
                k, v = self._queue.popleft()
                self._queued_bytes -= len(k) + len(v)
                self.stats["dropped"] += 1
            t = self._thread
            if t is None or not t.is_alive():
                t = self._thread = threading.Thread(target=self._writer,
                                                    name="incr-remote-writer", daemon=True)
                t.start()
            self._cv.notify_all()

    def _writer(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self.closed:
                    self._cv.wait()
                if not self._queue:
                    return
                batch, size = [], 0
                while self._queue and len(batch) < BATCH_ITEMS and size < BATCH_BYTES:
                    k, v = self._queue.popleft()
                    batch.append((k, v))
                    size += len(k) + len(v)
                self._queued_bytes -= size
                self._busy = True
            try:
                if time.monotonic() < self._write_down:
                    self.stats["dropped"] += len(batch)
                else:
                    try:
                        self.tier.put_many(batch)
                        self._warned_write = False
                        self.stats["pushed"] += len(batch)
                    except Exception as e:
                        self.stats["dropped"] += len(batch)
                        self._failed("writing", e, reads=False)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Wait until everything queued was sent (or dropped); False after ``timeout``."""
        end = time.monotonic() + timeout
        with self._cv:
            while self._queue or self._busy:
                t = self._thread
                if t is None or not t.is_alive():
                    break
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Flush (at most ``timeout`` seconds), stop the writer, close the tier. Idempotent;
        what could not be sent stays in the local store, with one warning."""
        if self.closed:
            return
        if not self.flush(timeout):
            warnings.warn(f"incr remote tier {self.name}: {len(self._queue)} records were not "
                          f"pushed within {timeout:g} s at close; they stay in the local store",
                          RemoteTierWarning, stacklevel=3)
        with self._cv:
            self.closed = True
            self.stats["dropped"] += len(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        try:
            self.tier.close()
        except Exception:
            pass

    def after_fork(self) -> None:
        """In a fork()ed child: the writer thread did not cross; start afresh (the parent
        pushes what it queued)."""
        self._cv = threading.Condition(threading.Lock())
        self._queue = deque()
        self._queued_bytes = 0
        self._busy = False
        self._thread = None
