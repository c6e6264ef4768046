"""Which tool names a ``[workload.NAME]`` table may give, and the driver behind each.

A workload module registers its driver class here at import (``@register``);
:mod:`vnetbench.workloads` imports every module, so importing the package is
enough to know them all. Adding a tool is: write its module, import it in
``workloads/__init__.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field

from vnetbench.workloads.base import Workload, WorkloadOptions

_DRIVERS: dict[str, Workload] = {}


def register(cls: type[Workload]) -> type[Workload]:
    if cls.tool in _DRIVERS:
        raise RuntimeError(f"two workload drivers for tool {cls.tool!r}")
    _DRIVERS[cls.tool] = cls()
    return cls


def drivers() -> dict[str, Workload]:
    _load()
    return dict(_DRIVERS)


def driver(tool: str) -> Workload:
    _load()
    try:
        return _DRIVERS[tool]
    except KeyError:
        raise KeyError(f"no workload driver for tool {tool!r}; known: {', '.join(sorted(_DRIVERS))}") from None


def of(options: WorkloadOptions) -> Workload:
    return driver(options.tool)


def options_models() -> dict[str, type[WorkloadOptions]]:
    _load()
    return {tool: d.Options for tool, d in _DRIVERS.items()}


def options_union() -> Any:
    """The type of one ``[workload.NAME]`` table: any registered tool's options, chosen by ``tool``."""
    models = tuple(options_models().values())
    return Annotated[Union[models], Field(discriminator="tool")]  # noqa: UP007 - a runtime-built union


def _load() -> None:
    if not _DRIVERS:
        import vnetbench.workloads  # noqa: F401 - importing the package registers every driver
