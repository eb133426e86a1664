"""Composition root: settings, Azure clients, logging context and metrics, built lazily."""
