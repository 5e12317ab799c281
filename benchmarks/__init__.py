"""The experiment drivers of asyncrl: each benchmark runs the product and writes a result file.

A package beside ``src/`` and ``tests/``, not part of the installed product: it imports ``asyncrl``,
and no module of ``asyncrl`` imports it (``tests/test_architecture.py`` fails if one does). One
command each, ``python -m benchmarks NAME [options]`` from the repository root (``__main__.py`` lists
them and dispatches); every benchmark module declares its own options (``add_arguments``) and its
entry (``run``). ``options.py`` holds the option helpers the benchmarks share and the start checks;
``runs.py`` and ``stats.py`` the run bookkeeping and the statistics of several benchmarks. The
results the documentation quotes, with the command of each, are listed in docs/results.md.
"""
