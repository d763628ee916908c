"""hvdtrain's version, in a module of its own: code inside the package reads it from here without
importing the ``hvdtrain`` package above it (``hvdtrain.__version__`` is this value)."""

__version__ = "0.1.0"
