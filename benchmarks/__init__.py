"""The benchmark suite: ``python -m benchmarks`` (``make bench``) measures, compares with floors, writes JSON + markdown.

Every figure is a ratio measured in one run against a floor or a baseline measured in the
same run, because these machines are shared and noisy; absolute times are reported beside
them for context only. No benchmark is a test: nothing here asserts a time.
"""
