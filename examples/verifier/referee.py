"""A separate verifier environment: it never sees the actor's session, only its grade frame."""

from __future__ import annotations

from durable_rollouts.envserver import Environment

env = Environment(name="referee", version="1.0.0")


@env.template(description="Award 1 when the actor's answer is the word reversed and not blank.")
async def referee(word: str = "drawer"):
    frame = yield f"Referee the reversal of '{word}'."
    if not isinstance(frame, dict) or frame.get("isError"):
        yield {"score": 0.0, "content": "the actor produced no gradable result"}
        return
    answer = str((frame.get("info") or {}).get("answer", "")).strip().lower()
    yield {"score": 1.0 if answer == word[::-1] else 0.0, "info": {"answer": answer}}
