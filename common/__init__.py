"""CNI plumbing shared by the meta-plugins: env and stdin parsing, verb dispatch, errors,
versions and result conversion, netns entry, state files and logging.

Nothing here knows about ports, rates or sysctls, and nothing here imports a heavy library
at import time: every container start pays for what this package imports.
"""
