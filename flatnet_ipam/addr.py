"""IP addresses as (family, integer): parsed as Go's net.ParseIP does and written as Go's
net.IP.String() writes them, because a lease file is named by that text and host-local
must find the same name.

Without the ipaddress module (it imports functools, re and more on every call); the
builtin _socket's inet_pton does the parsing.
"""

from __future__ import annotations

BITS = {4: 32, 6: 128}
_V4_MAPPED = 0xFFFF << 32


def parse_ip(text: str) -> tuple[int, int] | None:
    """(family, value) of an address without a prefix; None when it is not one. An
    IPv4-mapped IPv6 address is the IPv4 address (Go's To4), as host-local reads it."""
    import _socket

    if not isinstance(text, str) or not text or not text.isascii():
        return None
    try:
        if ":" in text:
            if "%" in text:
                return None  # a zone: Go's ParseIP refuses it too
            value = int.from_bytes(_socket.inet_pton(_socket.AF_INET6, text), "big")
            if value >> 32 == 0xFFFF:
                return 4, value & 0xFFFFFFFF
            return 6, value
        return 4, int.from_bytes(_socket.inet_pton(_socket.AF_INET, text), "big")
    except (OSError, ValueError):
        return None


def parse_cidr(text: str) -> tuple[int, int, int] | None:
    """(family, address, prefix length) of `a.b.c.d/n` or `x::y/n`, the address as
    written (host bits kept: the caller says whether they are allowed); None when it is
    not one."""
    if not isinstance(text, str):
        return None
    address, slash, prefix = text.partition("/")
    parsed = parse_ip(address)
    if parsed is None or not slash or not prefix.isdigit() or not prefix.isascii():
        return None
    family, value = parsed
    if family == 4 and ":" in address:
        return None  # an IPv4-mapped address with an IPv6 prefix length: ambiguous
    length = int(prefix)
    if length > BITS[family]:
        return None
    return family, value, length


def mask(family: int, length: int) -> int:
    bits = BITS[family]
    return ((1 << bits) - 1) ^ ((1 << (bits - length)) - 1)


def format_ip(family: int, value: int) -> str:
    """Go's net.IP.String(): dotted quad; IPv6 in lower-case hex groups with the longest
    run of two or more zero groups (the first of equals) written `::`."""
    if family == 4:
        return ".".join(str((value >> shift) & 0xFF) for shift in (24, 16, 8, 0))
    groups = [(value >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
    best, best_len, i = -1, 1, 0
    while i < 8:
        if groups[i] == 0:
            j = i
            while j < 8 and groups[j] == 0:
                j += 1
            if j - i > best_len:
                best, best_len = i, j - i
            i = j
        else:
            i += 1
    if best < 0:
        return ":".join(f"{g:x}" for g in groups)
    head = ":".join(f"{g:x}" for g in groups[:best])
    tail = ":".join(f"{g:x}" for g in groups[best + best_len :])
    return f"{head}::{tail}"


def format_cidr(family: int, value: int, length: int) -> str:
    return f"{format_ip(family, value)}/{length}"
