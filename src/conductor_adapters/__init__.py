"""What the services share to reach the outside world, behind the core's ports.

The trace database (schema, migrations, trace writes, run rows, API keys), the gRPC contract and
the planner's client, the Celery plumbing of the queue contract, the HTTP plumbing of provider
calls, the local llama.cpp engine, and the settings read from the environment.
"""
