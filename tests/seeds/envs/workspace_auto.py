# Seed 002, "Start Workspace Capability", with `hud` renamed to `durable_rollouts`.
from durable_rollouts.environment import Environment

env = Environment(name="coder")
env.workspace("workspace")   # publishes "shell" (ssh/2) when the env serves


# Ours (the seed declares no task): the agent writes a note in the workspace.
@env.template()
async def write_note(text: str = "hello"):
    answer = yield f"Write {text!r} to note.txt in the workspace and answer with its contents."
    yield 1.0 if answer == text else 0.0


tasks = [write_note()]
