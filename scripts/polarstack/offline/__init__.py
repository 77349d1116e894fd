"""make verify-offline: every rendered command line and pin against the pinned upstreams, and the meaning of recorded facts."""
