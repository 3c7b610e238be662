"""flatnet-ipam's CNI verbs: each parses the config and runs the library (flatnet_ipam.lib).

An IPAM plugin is exec'd by a main plugin with the main plugin's config on stdin; it needs
no netns (CNI_NETNS may be empty or absent for every verb).
"""

from __future__ import annotations

from flatnet_ipam import lib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.result import Result
    from common.skel import Request


def _config(request: Request) -> lib.IpamConfig:
    return lib.parse_config(request.conf, request.env.cni_args)


def add(request: Request) -> Result:
    return lib.allocate(_config(request), request.container_id, request.ifname, request.log)


def delete(request: Request) -> None:
    lib.release(_config(request), request.container_id, request.ifname, request.log)


def check(request: Request) -> None:
    lib.check(_config(request), request.container_id, request.ifname, request.log)


def gc(request: Request) -> None:
    from common.gc import valid_attachments

    valid = valid_attachments(request.conf.body)
    lib.gc(_config(request), valid, request.log)


def status(request: Request) -> None:
    lib.status(_config(request), request.log)
