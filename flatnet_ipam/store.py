"""The lease store (to be filled in)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.gc import AttachmentId
    from common.log import Log
    from common.result import Result
    from flatnet_ipam.config import IpamConfig


def allocate(config: IpamConfig, container_id: str, ifname: str, log: Log | None) -> Result:
    raise NotImplementedError


def release(config: IpamConfig, container_id: str, ifname: str, log: Log | None) -> list[str]:
    raise NotImplementedError


def check(config: IpamConfig, container_id: str, ifname: str, log: Log | None) -> list[str]:
    raise NotImplementedError


def gc(config: IpamConfig, valid: set[AttachmentId], log: Log | None) -> None:
    raise NotImplementedError


def status(config: IpamConfig, log: Log | None) -> None:
    raise NotImplementedError
