"""Checks before training: the smoke (route, exchange, judge, tool exchange), probe, sandbox probe, trace budget, bridge check, demo."""
