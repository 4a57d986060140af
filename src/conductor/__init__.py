"""Conductor: a learned planner that orchestrates a pool of worker LLMs.

This package is the domain core every service imports, and it performs no I/O: the workflow
model and its state machine, the Conductor protocol (prompt, parser, validator, schema), the
worker pool and the variants, the exception tree, the ports the services implement, the queue
contract between services, and the in-process executor that drives the machine.
"""

__version__ = "0.1.0"
