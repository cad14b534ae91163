"""HiveD's GPU-cluster scheduler model as a deterministic replicated state machine."""
