"""flatnet-ipam: table of contents.

parse    flatnet_ipam/config.py  the `ipam` section as host-local reads it (error 7)
         flatnet_ipam/addr.py    addresses parsed and written as Go does (lease file names)
store    flatnet_ipam/store.py   host-local's lease files and our index of them: claim,
                                 free, the cursor, adoption of other writers' leases, boot
library  flatnet_ipam/lib.py     allocate, release, check, gc, status: what the verbs run
                                 and what a main plugin (flatnet) calls in-process
verbs    flatnet_ipam/verbs.py   ADD, DEL, CHECK, GC, STATUS, imported on first use
"""


def main() -> None:
    from common import entry

    entry("flatnet-ipam")


if __name__ == "__main__":
    main()
