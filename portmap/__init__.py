"""The portmap CNI meta-plugin."""
