"""Many runs and what they show, above the library: each run goes through
:func:`emulator.control.run.run_scenario`.

* :mod:`.compare`: methods side by side, repeated with paired seeds, with intervals and verdicts;
* :mod:`.sweep`: a grid of runs (heterogeneity, crash rate, method), in parallel, resumable;
* :mod:`.paper`: ``make figures``: the paper's experiments, their figures and results.md.
"""
