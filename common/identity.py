"""Who an attachment is: the network (the config's name), the container and the
interface in it. The same three name a verb's request, a record in the store, an entry
of GC's list of valid attachments and, through the tag, portmap's kernel objects.
"""

from __future__ import annotations

from common.values import OrderedValue


def network_tag(network: str) -> str:
    """The first part of the tags of `network`'s attachments (GC looks for it)."""
    from common.digest import sha256_hex

    return sha256_hex(network.encode())[:8]


class Attachment(OrderedValue):
    network: str
    container_id: str
    ifname: str

    @property
    def tag(self) -> str:
        """`<network hash>-<attachment hash>`: a short stable id that names the store's
        files and portmap's kernel objects; GC tells a network's by the first part."""
        from common.digest import sha256_hex

        raw = "\0".join((self.network, self.container_id, self.ifname)).encode()
        return f"{network_tag(self.network)}-{sha256_hex(raw)[:16]}"

    def __str__(self) -> str:
        return f"{self.network}/{self.container_id}/{self.ifname}"
