"""bandwidth's own configuration: the rate and burst per direction (parse step, pure).

Where the limits come from, as upstream: the top-level keys `ingressRate`,
`ingressBurst`, `egressRate`, `egressBurst` when any of them is present, otherwise
`runtimeConfig.bandwidth` (what kubelet/containerd send through the `bandwidth`
capability). Keys are matched case-insensitively like Go's encoding/json. Rates are in
bits per second, bursts in bits. A rate and burst of 0 (or absent) mean "do not shape
this direction".

Only what can be judged without the kernel is validated here; limits that depend on the
device (one full packet must fit in the burst) are checked by the plan.
"""

from __future__ import annotations

from common.config import NetConf
from common.errors import UNSUPPORTED_FIELD, CniError, invalid_config
from common.jsonobj import JsonObject
from common.values import Value

KEYS = ("ingressRate", "ingressBurst", "egressRate", "egressBurst")
U64_MAX = (1 << 64) - 1
# tbf counts whole bytes per second: a rate below 8 bit/s is 0 bytes/s, "no rate".
MIN_RATE_BITS = 8
# The burst travels as whole microseconds of transmit time, and tbf's burst is a 32-bit
# byte count: one microsecond must not carry more than 2^32-1 bytes (~34 Pbit/s).
MAX_RATE_BITS = ((1 << 32) - 1) * 1_000_000 * 8


class Limit(Value):
    """One direction's limit as configured: rate in bit/s, burst in bits."""

    __slots__ = ("burst", "burst_key", "rate", "rate_key")

    rate: int
    burst: int
    rate_key: str  # where the values came from, for messages: "runtimeConfig.bandwidth.egressRate"
    burst_key: str

    def __init__(self, rate: int, burst: int, rate_key: str, burst_key: str) -> None:
        self.rate = rate
        self.burst = burst
        self.rate_key = rate_key
        self.burst_key = burst_key


class BandwidthConfig(Value):
    """Container ingress (traffic towards the container) and egress (from it)."""

    __slots__ = ("egress", "ingress")

    ingress: Limit | None
    egress: Limit | None

    def __init__(self, ingress: Limit | None = None, egress: Limit | None = None) -> None:
        self.ingress = ingress
        self.egress = egress

    @property
    def shapes_anything(self) -> bool:
        return self.ingress is not None or self.egress is not None


def _source(conf: NetConf) -> JsonObject:
    """Top-level keys win when any is present (upstream's embedded *BandwidthEntry)."""
    if any(conf.body.has(k) for k in KEYS):
        return conf.body
    return conf.runtime_config.child("bandwidth") or JsonObject({}, "runtimeConfig.bandwidth")


def _direction(obj: JsonObject, direction: str) -> Limit | None:
    rate_key, burst_key = f"{direction}Rate", f"{direction}Burst"
    rate: int = obj.integer(rate_key, 0, minimum=0, maximum=U64_MAX)
    burst: int = obj.integer(burst_key, 0, minimum=0, maximum=U64_MAX)
    if rate == 0 and burst == 0:
        return None
    if burst == 0:
        raise invalid_config(
            f"{obj.path(rate_key)} is set but {obj.path(burst_key)} is not",
            f"set {burst_key} (bits) as well, or remove {rate_key}",
        )
    if rate == 0:
        raise invalid_config(
            f"{obj.path(burst_key)} is set but {obj.path(rate_key)} is not",
            f"set {rate_key} (bits per second) as well, or remove {burst_key}",
        )
    if rate < MIN_RATE_BITS:
        raise invalid_config(
            f"{obj.path(rate_key)} {rate} bit/s is too small for tbf",
            f"tbf counts whole bytes per second; use at least {MIN_RATE_BITS} bit/s",
        )
    if rate > MAX_RATE_BITS:
        raise invalid_config(
            f"{obj.path(rate_key)} {rate} bit/s is more than tbf can be given",
            f"the most is {MAX_RATE_BITS} bit/s (2^32-1 bytes per microsecond); "
            f"for no limit, leave {rate_key} out",
        )
    # Any other rate tbf can count is fine: from 2^32 bytes/s on it travels as TCA_TBF_RATE64.
    # A burst too large or too small for tbf is not an error: kubelet sends 2^32-1 bits
    # when the user set none, the CNI docs' examples use less than one frame. The plan
    # adjusts it (and logs it) once the rate and the device's MTU are known.
    return Limit(rate, burst, obj.path(rate_key), obj.path(burst_key))


def parse(conf: NetConf) -> BandwidthConfig:
    obj = _source(conf)
    for key in ("shapedSubnets", "unshapedSubnets"):
        # Upstream 1.4+ shapes only some subnets (with htb). Ignoring the key would
        # shape everything, the opposite of what was asked: say so instead.
        if obj.array(key):
            raise CniError(
                UNSUPPORTED_FIELD,
                f"{obj.path(key)} is not supported by this bandwidth plugin",
                "it shapes all traffic of the attachment; remove the key",
            )
    return BandwidthConfig(ingress=_direction(obj, "ingress"), egress=_direction(obj, "egress"))
