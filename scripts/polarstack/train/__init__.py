"""Training: the GRPO launch plan, the launch itself, the in-job gate."""
