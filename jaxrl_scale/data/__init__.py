"""Prompt data: built-in tasks, TFDS / local-file records, templates and prompt sources."""
