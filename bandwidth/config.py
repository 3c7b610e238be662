"""bandwidth's own configuration: the rate and burst per direction (parse step, pure).

Where the keys come from and what they mean: docs/bandwidth.md#configuration. Only what
can be judged without the kernel is validated here; limits that depend on the device (one
full frame must fit in the burst) are checked by the plan.
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

    rate: int
    burst: int
    rate_key: str  # where the values came from, for messages: "runtimeConfig.bandwidth.egressRate"
    burst_key: str


class BandwidthConfig(Value):
    """Container ingress (traffic towards the container) and egress (from it)."""

    ingress: Limit | None = None
    egress: Limit | None = None

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
    if rate == 0 or burst == 0:
        given, missing, unit = (
            (rate_key, burst_key, "bits")
            if burst == 0
            else (burst_key, rate_key, "bits per second")
        )
        raise invalid_config(
            f"{obj.path(given)} is set but {obj.path(missing)} is not",
            f"set {missing} ({unit}) as well, or remove {given}",
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
        # Upstream 1.5.x shapes only some subnets (with htb; added in 1.5.0, reverted in
        # 1.6.0). Ignoring the key would shape everything, the opposite of what was
        # asked: say so instead.
        if obj.array(key):
            raise CniError(
                UNSUPPORTED_FIELD,
                f"{obj.path(key)} is not supported by this bandwidth plugin",
                "it shapes all traffic of the attachment; remove the key",
            )
    return BandwidthConfig(ingress=_direction(obj, "ingress"), egress=_direction(obj, "egress"))
