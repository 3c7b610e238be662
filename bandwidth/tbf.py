"""tbf arithmetic: from a configured rate and burst to the numbers the kernel stores (pure).

tbf keeps the burst as `buffer`, its transmit time at the rate in psched ticks (32 bits),
computed as pyroute2 does (`calc_xmittime`) so that CHECK compares exactly; its queue
`limit` is a 32-bit byte count (upstream's rate x 25 ms + burst). What upstream sends that
cannot work (a buffer overflowing 32 bits, a burst below one frame, a limit above 32 bits)
is adjusted and logged; a rate at which no burst passes a full frame is an error
(docs/bandwidth.md#configuration).
"""

from __future__ import annotations

from bandwidth.config import Limit
from bandwidth.model import Tbf
from common.errors import invalid_config
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

U32_MAX = (1 << 32) - 1
TIME_UNITS_PER_SEC = 1_000_000
NANOS_PER_SEC = 1_000_000_000
LATENCY_US = 25_000  # upstream's latencyInMillis = 25
ETH_HLEN = 14  # tbf measures frames with their Ethernet header
# pyroute2 also sends a 256-cell rate table for a 1600-byte MTU: cells of 8 bytes, the
# last one 2048 bytes; each cell's transmit time must fit in 32 bits as well.
RTAB_LAST_CELL = 2048


class Psched(Value):
    """The kernel's tick length, from /proc/net/psched (as pyroute2 and tc read it)."""

    tick_in_usec: float = 15.625  # ticks per microsecond on every current kernel

    @classmethod
    def parse(cls, text: str) -> Psched:
        fields = [int(x, 16) for x in text.split()]
        t2us, us2t, clock_res = fields[0], fields[1], fields[2]
        return cls(t2us / us2t * (clock_res / TIME_UNITS_PER_SEC))


def xmittime(rate: int, size: int, psched: Psched) -> int:
    """Ticks needed to send `size` bytes at `rate` bytes/s (pyroute2's calc_xmittime)."""
    return int(int(TIME_UNITS_PER_SEC * (float(size) / rate)) * psched.tick_in_usec)


def max_frame(rate: int) -> int:
    """The largest frame (bytes) tbf can pass at `rate` at all: the kernel caps the
    buffer's transmit time at 2^32-1 ns (~4.29 s) when it computes its max_size."""
    return U32_MAX * rate // NANOS_PER_SEC


def burst_in_kernel(rate: int, burst: int, psched: Psched) -> int:
    """The largest frame (bytes) tbf lets through with this burst: its max_size, the
    transmit time of the buffer at the rate. The burst travels as whole microseconds
    (calc_xmittime), then whole ticks (64 ns), and the kernel caps that time at 2^32-1 ns,
    so this is less than asked at high rates, and at most `max_frame` at low ones."""
    nanos = min(int(xmittime(rate, burst, psched) * 1000 / psched.tick_in_usec), U32_MAX)
    return nanos * rate // NANOS_PER_SEC


def min_burst(rate: int, packet: int, psched: Psched) -> int:
    """The smallest burst (bytes) that lets a `packet`-byte frame through at `rate`
    (which must allow one at all: max_frame(rate) >= packet)."""
    micros = -(-packet * TIME_UNITS_PER_SEC // rate)  # whole microseconds one frame takes
    while True:  # one or two more when the truncation to ticks (or floats) cost a byte
        burst = -(-micros * rate // TIME_UNITS_PER_SEC)
        if burst_in_kernel(rate, burst, psched) >= packet:
            return burst
        micros += 1


def queue_limit(rate: int, burst: int) -> int:
    """rate x 25 ms + burst, the queue length upstream asks for (may exceed 32 bits)."""
    return int(rate * LATENCY_US / TIME_UNITS_PER_SEC) + burst


def max_burst(rate: int, psched: Psched) -> int:
    """The largest burst (bytes) whose buffer fits in 32 bits, and whose queue limit does
    too where rate x latency leaves room for one (below ~1.37 Tbit/s)."""
    most = U32_MAX - queue_limit(rate, 0)
    if most <= 0:
        most = U32_MAX  # the limit is clamped anyway (make_tbf); the kernel's burst is a u32
    return _least(0, most + 1, lambda burst: xmittime(rate, burst, psched) > U32_MAX) - 1


def _expressible(rate: int, packet: int, psched: Psched) -> bool:
    if xmittime(rate, RTAB_LAST_CELL, psched) > U32_MAX or max_frame(rate) < packet:
        return False
    return min_burst(rate, packet, psched) <= max_burst(rate, psched)


def min_rate_bits(packet: int, psched: Psched) -> int:
    """The smallest rate (bit/s) at which tbf can still pass a `packet`-byte frame."""
    # 2^32 bytes/s is always expressible for any packet we see
    return _least(0, 1 << 32, lambda rate: _expressible(rate, packet, psched)) * 8


def _least(lo: int, hi: int, holds: Callable[[int], bool]) -> int:
    """The least x in (lo, hi] for which `holds`, a condition that stays true once it
    is (bisection; hi when it holds for nothing before)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi


def make_tbf(limit: Limit, mtu: int, where: str, psched: Psched) -> tuple[Tbf, str]:
    """The tbf for one direction, and a log note saying what had to be adjusted ("" if
    nothing). `where` names the device for messages ("host veth veth1234")."""
    rate = limit.rate // 8
    burst = limit.burst // 8
    packet = mtu + ETH_HLEN
    if not _expressible(rate, packet, psched):
        raise invalid_config(
            f"{limit.rate_key} {limit.rate} bit/s is too small for tbf",
            f"tbf passes no frame that takes longer than 2^32 ns (~4.29 s) at the rate, so "
            f"it would drop every full {packet}-byte frame of {where} (MTU {mtu} + "
            f"{ETH_HLEN}); use at least {min_rate_bits(packet, psched)} bit/s",
        )
    notes = []
    most = max_burst(rate, psched)
    if burst > most:
        notes.append(
            f"{limit.burst_key} {limit.burst} bits is more than tbf can hold at "
            f"{limit.rate} bit/s; clamped to {most * 8} bits ({most} bytes)"
        )
        burst = most
    elif burst_in_kernel(rate, burst, psched) < packet:
        least = min_burst(rate, packet, psched)
        notes.append(
            f"{limit.burst_key} {limit.burst} bits is smaller than one full {packet}-byte "
            f"frame of {where} (MTU {mtu} + {ETH_HLEN}), which tbf would always drop; "
            f"raised to {least * 8} bits ({least} bytes)"
        )
        burst = least
    queue = queue_limit(rate, burst)
    if queue > U32_MAX:
        notes.append(
            f"{limit.rate_key} {limit.rate} bit/s x {LATENCY_US // 1000} ms latency + burst is "
            f"{queue} bytes, more than tbf's 32-bit queue limit; clamped to {U32_MAX}"
        )
        queue = U32_MAX
    tbf = Tbf(rate=rate, burst=burst, buffer=xmittime(rate, burst, psched), limit=queue)
    return tbf, "; ".join(notes)
