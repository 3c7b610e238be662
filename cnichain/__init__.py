"""cni-chain: a program that runs a conflist's plugins like libcni (see cnichain.runner)."""
