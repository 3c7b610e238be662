"""Test harness: throwaway network namespaces, plugin and chain runners, real traffic."""
