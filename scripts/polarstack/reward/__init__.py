"""The reward: task data and the sandboxed code verifier."""
