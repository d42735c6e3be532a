# Seed 002, "Example Task Returning an Integer", with `hud` renamed to `durable_rollouts`
# (the seed's snippet uses an `env` it does not declare: declared here).
from durable_rollouts.environment import Answer, Environment

env = Environment(name="answers")


@env.template(returns=int)
async def count(word: str = "strawberry"):
    answer: Answer[int] = yield f"How many letters in '{word}'?"
    yield 1.0 if answer.content == len(word) else 0.0


tasks = [count(), count(word="kiwi")]
