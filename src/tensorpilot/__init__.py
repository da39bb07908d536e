"""tensorpilot: plan, train, measure and serve deep-learning models at the speed of the hardware.

``import tensorpilot`` stays cheap: torch and everything heavy load on first use of
:func:`train`, :func:`profile` or :class:`Trainer` (PEP 562 module ``__getattr__``).
"""

from tensorpilot.version import __version__
__all__ = ["__version__", "train", "profile", "Trainer", "Workload", "RunConfig"]

_LAZY = {
    "train": ("tensorpilot.api", "train"),
    "profile": ("tensorpilot.api", "profile"),
    "Trainer": ("tensorpilot.training.trainer", "Trainer"),
    "Workload": ("tensorpilot.workloads.base", "Workload"),
    "RunConfig": ("tensorpilot.config", "RunConfig"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'tensorpilot' has no attribute {name!r}")
