"""Conductor: a learned planner that orchestrates a pool of worker LLMs.

This package is the shared domain core every service imports: the workflow model, the
Conductor protocol (prompt, parser, validator), the worker pool, profiles, settings and traces.
"""

__version__ = "0.1.0"
