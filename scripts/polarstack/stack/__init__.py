"""The stack: profiles, the local and docker runtimes, compose, assets, the Ray head, listeners and exposure."""
