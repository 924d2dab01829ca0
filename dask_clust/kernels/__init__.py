"""numba kernels on plain numpy blocks.

Contract (as scikit-learn's ``.pyx`` kernels): inputs first, outputs last, every argument's role
(IN / OUT / INOUT), shape and dtype in the docstring; the caller allocates outputs; accumulation in
float64; no Dask, no Python objects, no closures, no ``prange`` (the Dask worker's threads supply the
parallelism, rule 2 of ARCHITECTURE.md). Every kernel that evaluates point-to-centre distances returns how
many it evaluated. Callers have validated the inputs; kernels do not re-check them.
"""
