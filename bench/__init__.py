"""Benchmarks, each a script run from the repository root (``bench/results/`` keeps what they
measured and how).

On top of the house, beside ``switchyard``: they may import any package (and ``tests.stack``
to start real processes); nothing imports them.
"""
