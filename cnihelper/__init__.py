"""cni-meta-helper: the optional resident helper that serves plugin calls from pre-forked,
pre-loaded workers (see cnihelper.server; the plugin side is common.fastpath)."""
