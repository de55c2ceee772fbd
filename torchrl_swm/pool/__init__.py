"""The pool of gymnasium environments and its backends."""

from .env_pool import EnvPool

__all__ = ["EnvPool"]
