"""Does local feedback pay? The evaluation harness from the design notes (MODEL.md §4).

    python -m benchmarks.feedback            # full run: 200 seeds, 4 scenarios, 5 arms, a sweep
    python -m benchmarks.feedback --quick    # 20 seeds, no sweep: seconds
    python -m benchmarks.feedback --model openai:NAME --base-url URL   # a real endpoint

Ten tasks with executable oracles (text-to-SQL on SQLite, multi-tenant cache-key repair,
input-validation regexes; controls whose first answers are correct), five arms at the same
budget of model calls, tokens and (simulated) seconds, four scenarios (clean, flaky
validators, late and out-of-order verdicts, an upstream change between attempts). The default
generator is a seeded simulation of a model with stated parameters, labelled as such in every
output. Prints tables, writes benchmarks/feedback/results.json (results-quick.json with
--quick) and docs/evaluation.svg. Never asserts anything about the figures. Method, bias and
results: docs/evaluation.md.
"""
