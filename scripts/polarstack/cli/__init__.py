"""The command line: argument wiring and rendering only."""
