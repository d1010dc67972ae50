"""What every test folder shares: the collector launcher (``support.collector``), processes
(``support.processes``) and rings that clean up after themselves (``support.rings``).

Importable as ``support`` because tests/ is on ``sys.path`` (tests/conftest.py). A free port is
``kernel_insight.run.free_port``, the one the product uses.
"""
