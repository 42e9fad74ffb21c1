"""Does local feedback pay? The evaluation harness (issue 16). SIMULATED model, unless
``--model openai:NAME`` (real.py) asks for a real one.

    python -m benchmarks.feedback --sweep   # the full run on docs/evaluation.md
    python -m benchmarks.feedback --quick   # 4 seeds: seconds
    python -m benchmarks.feedback --model openai:NAME --base-url URL --quick   # a real model

30 abstract tasks of 3-5 LLM nodes in 5 families (chain, codegen, upstream, diamond,
instances) with visible, protective and hidden checks and controls; imprecise blame; ten arms
(single, resample, whole, cache, recheck, incr, incr_norevert, incr_reuse, incr_par, strong)
compared on success-vs-spend curves (cost, calls, tokens) with bootstrap intervals over seeds;
per-attempt fix/break/gain/revert/stop rates, with intervals; keep-or-revert measured (incr
against incr_norevert, paired); a flaky-validator condition. The simulated model sees only the
prompt, its previous candidate, feedback from visible checks and a per-task latent skill;
every rate is pre-registered in config.toml. Never asserts a figure. Method, bias and results:
docs/evaluation.md.
"""
