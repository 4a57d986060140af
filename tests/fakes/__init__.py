"""Test doubles: in-process stand-ins (scripted) and fake vendor servers on loopback (*_server)."""
