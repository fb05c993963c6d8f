"""Issue 30, attack 5, on a real broker: the console's workloads page names the holder from the
claims on ``.claims`` that every reader accepts. Before, a claim record written to ``.in`` (the
producer role may write ``.in``) made the page show holder ``mallory-on-in``, epoch 9999."""

from __future__ import annotations

import httpx

from broker_schema import ClaimRecord, InputRecord, encode, topics
from broker_schema.binding import MAX_EPOCH
from broker_schema.records import InlineBody
from console.app import create_app
from fx_kafka.client import make_producer
from fx_kafka.workload import ensure_workload_topics


async def test_the_workloads_page_names_the_holder_from_claims_only(
    kafka_bootstrap: str, unique_workload_id: str,
) -> None:
    wid = unique_workload_id
    await ensure_workload_topics(kafka_bootstrap, wid)

    def claim(epoch: int, holder: str) -> bytes:
        return encode(ClaimRecord(workload_id=wid, epoch=epoch, holder_id=holder,
                                  spec_hash="sha256:" + "0" * 64, spec_offset=0))

    producer = make_producer(kafka_bootstrap)
    await producer.start()
    try:
        for topic, value in ((topics.claims(wid), claim(1, "holder-real")),
                             (topics.inputs(wid), claim(9999, "mallory-on-in")),
                             (topics.claims(wid), claim(MAX_EPOCH, "mallory-far")),
                             (topics.inputs(wid), encode(InputRecord(
                                 workload_id=wid, body=InlineBody.of_json(1))))):
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()
    transport = httpx.ASGITransport(app=create_app(kafka_bootstrap))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        page = await client.get("/")
        timeline = await client.get(f"/w/{wid}")
    assert page.status_code == 200, page.text[-2000:]
    row = page.text[page.text.index(wid):]
    row = row[:row.index("</tr>")]
    assert "holder-real" in row and "mallory" not in row, row
    assert timeline.status_code == 200
    assert "does not belong on .in" in timeline.text
