"""The bandwidth CNI meta-plugin."""
