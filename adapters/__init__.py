"""incr as the backend of other orchestrators (installed as ``incr.adapters``).

Each integration is an optional extra and imports its orchestrator only when used:

- ``incr.adapters.langgraph`` (``pip install 'incr[langgraph]'``): a LangGraph ``BaseCache`` on
  incr's LMDB store, incremental graph nodes, LLM nodes inside a graph;
- ``incr.adapters.prefect`` (``pip install 'incr[prefect]'``): a Prefect 3 ``CachePolicy`` keyed
  by incr's content keys, and tasks that run as incr cells;
- ``incr.adapters.dask`` / ``incr.adapters.ray`` (``pip install 'incr[dask]'`` / ``'incr[ray]'``):
  executors that run stale cells of ``rt.stabilize()`` on a cluster.
"""
