"""A small letters environment: count a letter, spell a word backwards, find the vowels.

Serve it with ``rollouts serve examples/letters/env.py`` and try it by hand with
``rollouts task start count_letter --args '{"word": "banana", "letter": "a"}'`` followed by
``rollouts task grade count_letter --answer 3``.
"""

from __future__ import annotations

from durable_rollouts.envserver import Answer, Environment

env = Environment(name="letters", version="1.0.0")


@env.template(description="Count how often a letter occurs in a word.")
async def count_letter(word: str = "strawberry", letter: str = "r"):
    answer = yield f"How many '{letter}' in '{word}'? Answer with a number."
    yield 1.0 if str(word.count(letter)) in str(answer or "") else 0.0


@env.template(description="Spell a word backwards.")
async def reverse_word(word: str = "stressed"):
    answer = yield {"prompt": f"Spell '{word}' backwards.", "word": word}
    expected = word[::-1]
    got = str(answer or "").strip().lower()
    yield {"score": 1.0 if got == expected else 0.0, "info": {"expected": expected}}


@env.template(description="List the distinct vowels of a word.", returns=list[str])
async def vowels(word: str = "education"):
    answer: Answer[list[str]] = yield f"Which distinct vowels occur in '{word}'? Answer as a JSON list."
    expected = {c for c in word.lower() if c in "aeiou"}
    content = answer.content if isinstance(answer.content, list) else []
    got = {str(c).lower() for c in content}
    yield len(expected & got) / max(len(expected | got), 1)


tasks = [
    count_letter(word="strawberry", letter="r"),
    count_letter(word="banana", letter="a"),
    reverse_word(word="drawer"),
    vowels(word="education"),
]
