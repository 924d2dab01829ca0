"""The benchmark harness (outside the installed package): the suites of ``benchmarks/run.py`` (``suites``,
``paper``, ``scaling``, rendered by ``report``), their measuring code (``measure``, ``data``) and the
output of the per-issue scripts (``common``). Scripts in ``benchmarks/`` import it as ``harness``."""
