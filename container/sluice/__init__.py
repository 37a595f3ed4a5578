"""Sluice's language-model container: train, evaluate, export, serve and monitor a causal LM."""

__version__ = "0.1.0"
