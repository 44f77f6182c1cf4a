"""Turning run directories into tables, figures and reports.

``runs``     load a run (one pandas table per trace stream) or many runs (a sweep, a folder)
``figures``  one function per figure: tables in, a matplotlib Figure out
``sweep``    mean and Student-t confidence interval per grid point; sweep.csv and sweep.md
``report``   ``build_report(path)``: PNGs, report.md and report.html in ``<path>/report/``
``notebooks/sweep.ipynb``  the same, interactively, for one sweep
"""
