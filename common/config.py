"""The network configuration on stdin, as every plugin sees it."""

from __future__ import annotations

from common import jsontext as json
from common import versions
from common.env import is_plain_name
from common.errors import DECODING_FAILURE, MAX_STDIN_BYTES, CniError, invalid_config
from common.jsonobj import JsonObject
from common.result import Result
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def decode(data: bytes) -> dict[str, Any]:
    """stdin bytes -> the config object; error 6 when it is not one."""
    if len(data) > MAX_STDIN_BYTES:
        raise CniError(
            DECODING_FAILURE,
            f"network configuration is {len(data)} bytes, more than the {MAX_STDIN_BYTES} allowed",
        )
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise CniError(
            DECODING_FAILURE, "network configuration is not valid JSON", str(e)
        ) from None
    if not isinstance(raw, dict):
        raise CniError(DECODING_FAILURE, "network configuration must be a JSON object")
    return raw


class NetConf(Value):
    """The fields of a network configuration that every plugin shares."""

    cni_version: str
    name: str
    runtime_config: JsonObject
    args: JsonObject
    prev_result: Result | None
    body: JsonObject  # the whole config, for the plugin's own keys

    @property
    def cni_args_object(self) -> JsonObject:
        """`args.cni`, the structured per-attachment arguments (empty when absent)."""
        return self.args.child("cni") or JsonObject({}, "args.cni")


def parse_netconf(raw: dict[str, Any]) -> NetConf:
    body = JsonObject(raw, "")
    # Missing means 0.1.0, as libcni reads it; unsupported is error 1.
    version = JsonObject(raw).string("cniVersion", "") or versions.DEFAULT_VERSION
    versions.require_supported(version)
    name = body.string("name", "")
    if not name:
        raise invalid_config("the network configuration has no 'name'")
    if not is_plain_name(name) or len(name) > 1024:
        raise invalid_config(
            f"invalid network name {name[:80]!r}",
            "a name starts with a letter or digit and contains only letters, digits, '_', '.', '-'",
        )
    # Read only to refuse what Go's NetConf refuses: a type or capabilities of another kind.
    body.string("type")
    body.child("capabilities")
    runtime_config = body.child("runtimeConfig") or JsonObject({}, "runtimeConfig")
    args = body.child("args") or JsonObject({}, "args")
    prev_raw = body.get("prevResult")
    prev = None if prev_raw is None else Result.from_json(prev_raw, version)
    return NetConf(
        cni_version=version,
        name=name,
        runtime_config=runtime_config,
        args=args,
        prev_result=prev,
        body=body,
    )
