"""The pool of gymnasium environments and its backends (serial, process, vector)."""


def __getattr__(name: str):
    # Lazy: worker processes import pool submodules without torchrl.
    if name == "EnvPool":
        from .env_pool import EnvPool

        return EnvPool
    raise AttributeError(f"module 'torchrl_swm.pool' has no attribute {name!r}")


__all__ = ["EnvPool"]
