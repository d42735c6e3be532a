"""A stream's pages, manifest and closed-job cursors in an S3 bucket (moto's standalone server):
named objects under the URL's prefix, encrypted when a payload key is set, a missing one None."""

from __future__ import annotations

import asyncio
import base64
import os

from durable_rollouts.models import RolloutResult
from durable_rollouts.temporal.codec import KEY_ENV_VAR
from durable_rollouts.temporal.stream_pages import StreamStore
from durable_rollouts.workflows.stream import FinishedGroup
from durable_rollouts.workflows.stream_paging import StreamManifest


def _group(seq: int) -> FinishedGroup:
    result = RolloutResult(rollout_id=f"r{seq}", slug="t", group_id=f"g{seq}", group_index=0,
                           row_index=seq, status="succeeded", error="sk-SECRET-in-a-result")
    return FinishedGroup(seq=seq, group_id=f"g{seq}", row_index=seq, slug="t", size=1, results=[result])


def test_pages_and_cursors_live_under_the_prefix_encrypted(s3_storage, s3_server, monkeypatch) -> None:
    _, bucket = s3_storage
    monkeypatch.setenv(KEY_ENV_VAR, base64.b64encode(os.urandom(32)).decode())
    store = StreamStore("job-s3")

    async def go() -> None:
        assert await store.manifest() is None and await store.cursor("trainer") == 0
        await store.put_page(0, [_group(0), _group(1)])
        await store.put_page(1, [_group(2)])
        await store.put_manifest(StreamManifest(job_id="job-s3", page_size=2, delivered=3,
                                                cursors={"trainer": 3}))
        assert await store.put_cursor("late", 2) == 2
        fresh = StreamStore("job-s3")
        assert [g.seq for g in await fresh.read(1, 5, 2, 3)] == [1, 2]
        manifest = await fresh.manifest()
        assert manifest is not None and manifest.cursors == {"trainer": 3}
        assert await fresh.cursor("late") == 2

    asyncio.run(go())
    keys = set(s3_server.objects(bucket))
    assert {"jobs/streams/job-s3/b0/page-00000000.jsonl", "jobs/streams/job-s3/b0/page-00000001.jsonl",
            "jobs/streams/job-s3/b0/manifest.json", "jobs/streams/job-s3/b0/cursors/late.json"} <= keys
    for key in keys:
        body = s3_server.boto().get_object(Bucket=bucket, Key=key)["Body"].read()
        assert b"sk-SECRET" not in body and b'"cursors"' not in body, key
