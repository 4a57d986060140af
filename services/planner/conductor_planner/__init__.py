"""The planner service: renders the Conductor prompt, generates, parses and validates plans."""

from conductor_planner.planner import ConductorPlanner

__all__ = ["ConductorPlanner"]
