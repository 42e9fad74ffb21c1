"""Run the stale cells of ``rt.stabilize()`` on Ray (``pip install 'incr[ray]'``).

    import ray, incr
    from incr.adapters.ray import RayExecutor

    ray.init(num_cpus=2)
    rt = incr.Runtime(executor=RayExecutor())

Same contract as ``incr.adapters.dask``: independent stale instances run as Ray tasks with the
values of the dependencies their last run read, and are recorded exactly as local runs. A task
whose worker dies is retried by Ray (``max_retries``, default 3); if it still fails, the cell
runs in the driver and a ``RuntimeWarning`` says so.
"""

from __future__ import annotations

from typing import Any


def _call(fn, *args):
    return fn(*args)


class RayExecutor:
    """An incr executor on the Ray cluster this process is connected to (``ray.init()``)."""

    def __init__(self, **task_options: Any):
        try:
            import ray
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("incr.adapters.ray needs Ray: pip install 'incr[ray]'") from e
        if not ray.is_initialized():
            raise RuntimeError("RayExecutor: call ray.init() first (ray.init(num_cpus=2) starts "
                               "a local cluster)")
        self._ray = ray
        options = {"max_retries": 3, **task_options}
        self._task = ray.remote(_call).options(**options)

    def submit(self, fn, *args):
        return self._task.remote(fn, *args)

    def results(self, handles: list) -> list:
        """(True, result) or (False, the executor's exception), in order."""
        out = []
        for h in handles:
            try:
                out.append((True, self._ray.get(h)))
            except Exception as e:
                out.append((False, e))
        return out

    def __repr__(self):
        return "RayExecutor()"
