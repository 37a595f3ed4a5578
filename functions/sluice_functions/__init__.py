"""Sluice's Lambda functions: thin handlers over pure request builders; no torch here."""

__version__ = "0.1.0"
