"""Names vulture reports as unused that are used, each with the reason (read by vulture only).

`_` stands for any object: an entry `_.name` keeps every attribute of that name.
"""

# common/skel.py names a lazily imported verb after its target, for tracebacks and repr.
_.__qualname__

# common/records.py's run-time Generic: Python calls it for `Generic[R]` in a class's bases.
_.__class_getitem__

# Parameters fixed by a protocol, not chosen: the signal handler's (signum, frame) in
# common/lock.py, and __exit__'s traceback in tuning/apply.py.
signum
frame
tb

# common/errors.py lists the CNI spec's well-known error codes whole, as the spec's table
# does, also the two no verb of ours raises.
UNKNOWN_CONTAINER
STATUS_LIMITED

# common/jsontext.py hands its context object to CPython's C JSON scanner (`_json`), which
# reads these attributes by name.
_.strict
_.object_hook
_.object_pairs_hook
_.parse_float
_.parse_int
_.parse_constant

# common/result.py reads and writes the fields of its result classes through one table per
# class (getattr and keyword arguments by name).
_.socket_path
_.pci_id
_.gw
_.advmss
_.priority
_.scope
_.nameservers
_.domain

# pyroute2 reads a message class's `nla_map` when it compiles the class, and calls the
# method an entry names (bandwidth/tc.py's tc message: tbf options with the 64-bit rate
# attributes, and `get_options`, which picks a kind's options class).
_.nla_map
_.get_options

# cnichain's public API (docs/python-api.md) for users' tests: what only examples/ and
# tests/ call, and the pytest plugin's fixtures, which pytest finds by name.
_.attach
_.container
_.detach
cni_chain

# tuning's link options are read and written by name: the fields of tuning/config.py's
# LinkSettings through LINK_OPTIONS, the flag bits of common/rtnl.py through
# tuning/apply.py's FLAGS.
_.promisc
_.allmulti
_.tx_qlen
IFF_PROMISC
IFF_ALLMULTI
