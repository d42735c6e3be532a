# Seed 002, "Manually Manage Workspace Lifecycle", with `hud` renamed to `durable_rollouts`.
from durable_rollouts.environment import Environment, Workspace

env = Environment(name="coder")
ws = Workspace("workspace", host="127.0.0.1", port=0)   # port 0 → ephemeral

@env.initialize
async def _up():
    await ws.start()                          # binds, generates keys; idempotent
    env.add_capability(ws.capability("shell"))

@env.shutdown
async def _down():
    await ws.stop()


# Ours (the seed declares no task).
@env.template()
async def write_note(text: str = "hello"):
    answer = yield f"Write {text!r} to note.txt in the workspace and answer with its contents."
    yield 1.0 if answer == text else 0.0


tasks = [write_note()]
