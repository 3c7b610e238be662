"""Real runtimes (podman, libcni's cnitool, containerd CRI) driving our plugins and Go's."""
