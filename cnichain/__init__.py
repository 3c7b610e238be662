"""Run CNI network lists the way libcni does: the `cni-chain` program, a Python API
(cnichain.api, re-exported here), throwaway network namespaces (cnichain.netns) and a
pytest plugin (cnichain.pytest_plugin). docs/python-api.md describes them."""

from cnichain.api import (
    Attachment,
    ChainError,
    ConfList,
    Network,
    PluginError,
    default_plugin_path,
    load_conflist,
)

__all__ = [
    "Attachment",
    "ChainError",
    "ConfList",
    "Network",
    "PluginError",
    "default_plugin_path",
    "load_conflist",
]
