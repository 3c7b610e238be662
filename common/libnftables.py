"""libnftables through ctypes, the few calls portmap and flatnet make: the nftables
project's Python binding is not on PyPI, and Debian's python3-nftables is installed into
the system Python, which the plugins' venv or bundle does not see. A context lives as
long as the process (never freed: the process exits)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes

SONAME = "libnftables.so.1"
_OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON; no other output flag is ever set
_lib: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    """The library with the prototypes of the calls we make; OSError when it is missing."""
    global _lib
    if _lib is None:
        import ctypes

        lib = ctypes.CDLL(SONAME)
        ptr = ctypes.c_void_p
        for name, restype, argtypes in (
            ("nft_ctx_new", ptr, [ctypes.c_int]),
            ("nft_ctx_buffer_output", ctypes.c_int, [ptr]),
            ("nft_ctx_buffer_error", ctypes.c_int, [ptr]),
            ("nft_ctx_get_output_buffer", ctypes.c_char_p, [ptr]),
            ("nft_ctx_get_error_buffer", ctypes.c_char_p, [ptr]),
            ("nft_ctx_output_set_flags", None, [ptr, ctypes.c_uint]),
            ("nft_run_cmd_from_buffer", ctypes.c_int, [ptr, ctypes.c_char_p]),
        ):
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = lib
    return _lib


class Context:
    """One nft context, with output and errors buffered; it talks to the kernel of the
    network namespace it was made in."""

    __slots__ = ("ctx", "lib")

    def __init__(self) -> None:
        self.lib = load()
        self.ctx = self.lib.nft_ctx_new(0)
        self.lib.nft_ctx_buffer_output(self.ctx)
        self.lib.nft_ctx_buffer_error(self.ctx)

    def set_json_output(self, on: bool) -> None:
        self.lib.nft_ctx_output_set_flags(self.ctx, _OUTPUT_JSON if on else 0)

    def run(self, text: str) -> tuple[int, str, str]:
        """(return code, output, errors) of nft commands in nft's own syntax."""
        rc = self.lib.nft_run_cmd_from_buffer(self.ctx, text.encode())
        out = self.lib.nft_ctx_get_output_buffer(self.ctx) or b""
        err = self.lib.nft_ctx_get_error_buffer(self.ctx) or b""
        return int(rc), out.decode(errors="replace"), err.decode(errors="replace")
