# Seed 002, "Environment and Workspace Setup", with `hud` renamed to `durable_rollouts`.
from durable_rollouts.environment import Environment, Mount

env = Environment(name="coder")
env.workspace(
    "/workspace",
    network=True,
    mounts=[Mount("ro", src="/data", dst="/data")],
)
