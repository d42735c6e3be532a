"""CPU per control-channel rollout to an in-process env: TCP against the socket-pair shortcut.

    python benchmarks/bench_connect.py [--n 2000] [--concurrency 32] [--repeats 5]

Serves ``examples/letters`` in this process and runs ``--n`` short sessions through the real
client (connect + ``hello``, ``tasks.start``, ``tasks.grade``, ``bye``), ``--concurrency`` at a
time, once over loopback TCP (the shortcut switched off for the run) and once over the socket
pair that ``streams.open_stream`` hands a client on the server's own loop, interleaved
``--repeats`` times. Prints the process CPU and wall per session (median and range) and the
ratio. This is what a ``LocalRuntime`` rollout's agent step pays for its one control connection.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _common import LETTERS

from durable_rollouts.client.envclient import connect
from durable_rollouts.envserver import load_environment, serving
from durable_rollouts.streams import register_local, unregister_local


async def _session(url: str) -> None:
    client = await connect(url, keepalive_s=None)
    await client.start_task("count_letter", {"word": "banana", "letter": "a"})
    reply = await client.grade("3")
    assert reply["score"] == 1.0, reply
    await client.bye()


async def _run(url: str, n: int, concurrency: int) -> tuple[float, float]:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await _session(url)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return (time.process_time() - cpu) / n * 1e3, (time.perf_counter() - wall) / n * 1e3


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    env = load_environment(LETTERS, None)
    results: dict[str, list[tuple[float, float]]] = {"tcp": [], "socket pair": []}
    async with serving(env) as server:
        await _run(server.url, 200, args.concurrency)  # warm up both paths' imports and caches
        for _ in range(args.repeats):
            unregister_local(server.host, server.port, server._connect_local)
            results["tcp"].append(await _run(server.url, args.n, args.concurrency))
            register_local(server.host, server.port, server._connect_local)
            results["socket pair"].append(await _run(server.url, args.n, args.concurrency))
            print(f"  tcp {results['tcp'][-1][0]:.3f} ms cpu, socket pair "
                  f"{results['socket pair'][-1][0]:.3f} ms cpu per session", flush=True)
    print(f"{args.n} sessions at concurrency {args.concurrency}, median of {args.repeats} [range]:")
    medians = {}
    for name, runs in results.items():
        cpus, walls = [r[0] for r in runs], [r[1] for r in runs]
        medians[name] = statistics.median(cpus)
        print(f"  {name:12} cpu ms/session {medians[name]:.3f} [{min(cpus):.3f}-{max(cpus):.3f}]  "
              f"wall ms/session {statistics.median(walls):.3f} [{min(walls):.3f}-{max(walls):.3f}]")
    print(f"socket pair / tcp cpu ratio {medians['socket pair'] / medians['tcp']:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
