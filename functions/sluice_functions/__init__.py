"""Sluice's Lambda functions: thin handlers over pure request builders; no torch here."""
