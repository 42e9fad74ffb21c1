"""Run the stale cells of ``rt.stabilize()`` on a Dask cluster (``pip install 'incr[dask]'``).

    from distributed import Client, LocalCluster
    import incr
    from incr.adapters.dask import DaskExecutor

    client = Client(LocalCluster(n_workers=2, threads_per_worker=1))
    rt = incr.Runtime(store=".incr", executor=DaskExecutor(client))

Each stabilization sends the independent stale instances to the workers, with the values of
the dependencies their last run read; the results are recorded in the trace and the store
exactly as a local run would record them (see ``incr.remote``). Cells marked
``@incr.cell(local=True)``, LLM nodes and effects always run in the driver. A worker lost
mid-task is Dask's to retry (``allowed_failures``); if the task still fails, the cell runs in the
driver instead and a ``RuntimeWarning`` says so.
"""

from __future__ import annotations

from typing import Any


class DaskExecutor:
    """An incr executor on a ``distributed.Client`` (default: the current client)."""

    def __init__(self, client: Any = None, **submit_options: Any):
        try:
            import distributed
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("incr.adapters.dask needs Dask's distributed scheduler: "
                              "pip install 'incr[dask]'") from e
        self.client = client if client is not None else distributed.get_client()
        self.options = submit_options

    def submit(self, fn, *args):
        # pure=False: two runs of one cell with equal arguments are still two runs
        return self.client.submit(fn, *args, pure=False, **self.options)

    def results(self, handles: list) -> list:
        """(True, result) or (False, the executor's exception), in order."""
        out = []
        for f in handles:
            try:
                out.append((True, f.result()))
            except Exception as e:
                out.append((False, e))
        return out

    def __repr__(self):
        return f"DaskExecutor({self.client!r})"
