"""incr's benchmark suite (not part of the installed package).

Run from the repository root: ``python -m benchmarks`` (about ten minutes on two cores),
``python -m benchmarks --quick`` (under a minute), ``--only chain,tree`` for some workloads.
Layout: ``workloads.py`` (seeded, peer-agnostic workloads), ``peers/`` (one adapter module per
system, all with build/change/read), ``harness.py`` (how one pair is timed, in its own
process), ``__main__.py`` (the table, the targets, results.json). Method and biases:
docs/performance.md.
"""
