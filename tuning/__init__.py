"""The tuning CNI meta-plugin."""
