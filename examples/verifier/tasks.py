"""Two verifier setups for the same actor task.

* ``same_env``: the verifier is a template of the actor's env, so it runs on the actor's server
  (a fresh session) and nothing else is provisioned;
* ``separate_env``: the verifier env lives in referee.py, so it gets its own substrate.

Run: ``python -c "import asyncio, tasks; ..."`` or see tests/sdk/test_verifier_example.py.
"""

from __future__ import annotations

import spelling as actor
import referee

from durable_rollouts.sdk.taskset import Taskset

WORDS = ("drawer", "stressed")

same_env = Taskset("verifier-same-env", [
    actor.spell_backwards(word=w).model_copy(update={"verifier": actor.check_reversed(word=w)})
    for w in WORDS
])

separate_env = Taskset("verifier-separate-env", [
    actor.spell_backwards(word=w).model_copy(update={"verifier": referee.referee(word=w)})
    for w in WORDS
])
