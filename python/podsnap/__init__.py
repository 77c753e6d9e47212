"""podsnap: capture one initialized GPU inference worker, restore every new replica from it."""

__version__ = "0.1.0"
__all__ = ["__version__"]
