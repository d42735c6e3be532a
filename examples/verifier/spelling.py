"""The actor's environment: spell a word backwards; its own grade only records the answer.

The real judgement comes from a verifier task graded with the actor's grade frame:
``check_reversed`` lives in this same env (reusing the actor's server), ``referee.py`` holds a
separate env (its own substrate). See tasks.py.
"""

from __future__ import annotations

from durable_rollouts.envserver import Environment

env = Environment(name="spelling", version="1.0.0")


@env.template(description="Spell a word backwards (graded by a verifier).")
async def spell_backwards(word: str = "drawer"):
    answer = yield f"Spell '{word}' backwards. Answer with the word only."
    text = str(answer or "").strip()
    # The actor's grade is provisional: it only says whether there is an answer at all.
    yield {"score": 1.0 if text else 0.0, "content": text, "info": {"answer": text, "word": word}}


@env.template(description="Verifier: check the actor's answer really is the word reversed.")
async def check_reversed(word: str = "drawer"):
    frame = yield f"Verify the reversal of '{word}'."  # the answer is the actor's grade frame
    answer = ((frame or {}).get("info") or {}).get("answer", "") if isinstance(frame, dict) else ""
    ok = str(answer).strip().lower() == word[::-1]
    yield {"score": 1.0 if ok else 0.0, "info": {"checked": answer, "expected": word[::-1]}}
