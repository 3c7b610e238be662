"""Run CNI network lists the way libcni does: the `cni-chain` program, a Python API
(cnichain.api, re-exported here), throwaway network namespaces (cnichain.netns), the lab
the pytest fixtures hand out (cnichain.lab) and a pytest plugin (cnichain.pytest_plugin).
docs/python-api.md describes them.

cnichain execs the plugins like any runtime and imports none of them, nor their shared
`common` package (the import contracts in pyproject.toml keep it so).
"""

from cnichain.api import (
    Attachment,
    ChainError,
    ConfList,
    Network,
    PluginCall,
    PluginError,
    default_plugin_path,
    load_conflist,
    plugin_call,
)
from cnichain.lab import ChainLab

__all__ = [
    "Attachment",
    "ChainError",
    "ChainLab",
    "ConfList",
    "Network",
    "PluginCall",
    "PluginError",
    "default_plugin_path",
    "load_conflist",
    "plugin_call",
]
