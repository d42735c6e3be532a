"""durable_rollouts: agent rollouts against RL environments, made durable by Temporal."""
