# Seed 004, "The golden path (v6)", with `hud` renamed to `durable_rollouts`; nothing else changed.
from durable_rollouts import Environment

env = Environment(name="letter-count")


@env.template()
async def count_letter(word: str = "strawberry", letter: str = "r"):
    answer = yield f"How many '{letter}'s are in '{word}'?"
    yield 1.0 if answer and str(word.count(letter)) in answer else 0.0


tasks = [count_letter(word=w) for w in ("strawberry", "raspberry", "blueberry")]
