"""The one version string of longpack: ``pyproject.toml`` reads it (setuptools dynamic ``version``), and
``longpack.__version__``, ``longpack --version`` and every pack manifest show it."""

__version__ = "0.1.0"
