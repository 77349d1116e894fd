"""Measurements: profiles side by side, routing under agent load, the router release matrix."""
