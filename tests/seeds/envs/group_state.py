# Module state a group's members would leak to each other if they shared an Environment.
import asyncio
import time

import group_state_helper  # a sibling module: imported once, stays cached across rollouts

from durable_rollouts.environment import Environment

env = Environment(name="group-state")
state = {"inits": 0, "seen": 0, "stops": 0}


@env.initialize
async def _up() -> None:
    state["inits"] += 1
    group_state_helper.LOADS.append(id(env))


@env.shutdown
async def _down() -> None:
    state["stops"] += 1


@env.template()
async def probe(hold: float = 0.3):
    state["seen"] += 1
    began = time.time()
    await asyncio.sleep(hold)  # the group's members overlap here when they run concurrently
    answer = yield "say anything"
    yield {"score": 1.0, "info": {"inits": state["inits"], "seen": state["seen"], "env": id(env),
                                  "began": began, "ended": time.time(),
                                  "helper": id(group_state_helper)}}


tasks = [probe()]
