# A conversation env for seed 003's deriving replay taskset: the prompt is the history so far.
from durable_rollouts.environment import Environment

env = Environment(name="chat")


@env.template()
async def chat(history: list[str] = [], topic: str = "tea"):  # noqa: B006
    answer = yield "\n".join(history) or f"Say something about {topic}."
    yield {"score": 1.0 if answer else 0.0, "info": {"turns": len(history) + 1}}


tasks = [chat(topic=t) for t in ("tea", "rain")]
