"""Compatibility with other toolkits' configs and run scripts (one room per toolkit: ``compat.verl``)."""
