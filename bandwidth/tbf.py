"""tbf arithmetic: from a configured rate and burst to the numbers the kernel stores (pure).

tbf keeps the burst not in bytes but as `buffer`, the time the burst takes at the rate, in
psched ticks, in a 32-bit field; its queue `limit` is a 32-bit byte count. Upstream
computes limit = rate x latency + burst with a latency of 25 ms, and so do we.

The buffer is computed exactly the way pyroute2 computes it from the burst we hand it
(`calc_xmittime`), so that CHECK can compare the kernel's value with ours exactly.

Two situations upstream gets wrong:
* kubelet/containerd send a burst of 2^32-1 bits when the pod sets none. At low rates
  its transmit time overflows the 32-bit buffer (Go wraps it around silently, giving a
  random burst). We clamp the burst to the largest that fits and say so in the log.
* a rate so small that even the largest buffer cannot hold one full packet, or a burst
  smaller than one packet: tbf would drop every full-size packet. That is an error here.
"""

from __future__ import annotations

from bandwidth.config import Limit
from bandwidth.model import Tbf
from common.errors import invalid_config
from common.values import Value

U32_MAX = (1 << 32) - 1
TIME_UNITS_PER_SEC = 1_000_000
LATENCY_US = 25_000  # upstream's latencyInMillis = 25
ETH_HLEN = 14  # tbf measures frames with their Ethernet header
# pyroute2 also sends a 256-cell rate table for a 1600-byte MTU: cells of 8 bytes, the
# last one 2048 bytes; each cell's transmit time must fit in 32 bits as well.
RTAB_LAST_CELL = 2048


class Psched(Value):
    """The kernel's tick length, from /proc/net/psched (as pyroute2 and tc read it)."""

    __slots__ = ("tick_in_usec",)

    tick_in_usec: float  # ticks per microsecond on every current kernel

    def __init__(self, tick_in_usec: float = 15.625) -> None:
        self.tick_in_usec = tick_in_usec

    @classmethod
    def parse(cls, text: str) -> Psched:
        fields = [int(x, 16) for x in text.split()]
        t2us, us2t, clock_res = fields[0], fields[1], fields[2]
        return cls(t2us / us2t * (clock_res / TIME_UNITS_PER_SEC))


def xmittime(rate: int, size: int, psched: Psched) -> int:
    """Ticks needed to send `size` bytes at `rate` bytes/s (pyroute2's calc_xmittime)."""
    return int(int(TIME_UNITS_PER_SEC * (float(size) / rate)) * psched.tick_in_usec)


def burst_in_kernel(rate: int, burst: int, psched: Psched) -> int:
    """The bytes tbf can really send at once: the burst travels as whole microseconds of
    transmit time (calc_xmittime), which at high rates is noticeably less than asked."""
    return int(int(TIME_UNITS_PER_SEC * (float(burst) / rate)) * rate / TIME_UNITS_PER_SEC)


def min_burst(rate: int, packet: int, psched: Psched) -> int:
    """The smallest burst (bytes) that still holds a `packet`-byte frame at `rate`."""
    micros = -(-packet * TIME_UNITS_PER_SEC // rate)  # whole microseconds one frame takes
    burst = -(-micros * rate // TIME_UNITS_PER_SEC)
    while burst_in_kernel(rate, burst, psched) < packet:  # float rounding in calc_xmittime
        burst += 1
    return burst


def queue_limit(rate: int, burst: int) -> int:
    return int(rate * LATENCY_US / TIME_UNITS_PER_SEC) + burst


def max_burst(rate: int, psched: Psched) -> int:
    """The largest burst (bytes) whose buffer and queue limit both fit in 32 bits."""
    hi = U32_MAX - int(rate * LATENCY_US / TIME_UNITS_PER_SEC)
    if hi <= 0:
        return 0
    if xmittime(rate, hi, psched) <= U32_MAX:
        return hi
    lo = 0  # invariant: xmittime(lo) fits, xmittime(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xmittime(rate, mid, psched) <= U32_MAX:
            lo = mid
        else:
            hi = mid
    return lo


def _expressible(rate: int, packet: int, psched: Psched) -> bool:
    return xmittime(rate, RTAB_LAST_CELL, psched) <= U32_MAX and max_burst(rate, psched) >= packet


def min_rate_bits(packet: int, psched: Psched) -> int:
    """The smallest rate (bit/s) at which tbf can still pass a `packet`-byte frame."""
    lo, hi = 0, 1 << 32  # bytes/s; hi is always expressible for any packet we see
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _expressible(mid, packet, psched):
            hi = mid
        else:
            lo = mid
    return hi * 8


def make_tbf(limit: Limit, mtu: int, where: str, psched: Psched) -> tuple[Tbf, str]:
    """The tbf for one direction, and a log note when the burst had to be clamped.

    `where` names the device for messages ("host veth veth1234").
    """
    rate = limit.rate // 8
    burst = limit.burst // 8
    packet = mtu + ETH_HLEN
    if not _expressible(rate, packet, psched):
        raise invalid_config(
            f"{limit.rate_key} {limit.rate} bit/s is too small for tbf",
            f"at that rate tbf's 32-bit buffer cannot hold one full {packet}-byte packet "
            f"of {where}; use at least {min_rate_bits(packet, psched)} bit/s",
        )
    note = ""
    most = max_burst(rate, psched)
    if burst > most:
        note = (
            f"{limit.burst_key} {limit.burst} bits is more than tbf can hold at "
            f"{limit.rate} bit/s; clamped to {most * 8} bits ({most} bytes)"
        )
        burst = most
    if burst_in_kernel(rate, burst, psched) < packet:
        raise invalid_config(
            f"{limit.burst_key} {limit.burst} bits is smaller than one full packet",
            f"{where} sends frames of up to {packet} bytes (MTU {mtu} + {ETH_HLEN}) and tbf "
            f"drops any frame larger than the burst (which it keeps in whole microseconds at "
            f"the rate); use at least {min_burst(rate, packet, psched) * 8} bits",
        )
    tbf = Tbf(
        rate=rate,
        burst=burst,
        buffer=xmittime(rate, burst, psched),
        limit=queue_limit(rate, burst),
    )
    return tbf, note
