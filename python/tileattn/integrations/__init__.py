"""Hooks that plug tileattn into other libraries' attention dispatch (transformers)."""
