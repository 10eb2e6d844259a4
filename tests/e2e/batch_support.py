"""What the Batch API's end-to-end test and its benchmark (bench/batch.py) share: a market
without failures (so one provider call per line is exact, not a retry of a 5xx), the batch
file, the round trip through the official ``openai`` SDK, and the simulator's counts."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from tests.stack import REFERENCE_MARKET, Stack

BATCH_KEY = "sk-sy-test-acme-indexer-0001"  # acme/search/indexer
WEB_KEY = "sk-sy-test-acme-web-0001"  # acme/search/web: interactive
MODEL = "acme/chat-small"  # alpha and gamma's chat-small: the market's fastest chat model
PROVIDERS = ("alpha", "gamma")


def market_without_failures(folder: Path) -> Path:
    """The reference market with no 5xx and no overload: every retry would be the gateway's."""
    market = yaml.safe_load(REFERENCE_MARKET.read_text())
    for provider in market["providers"]:
        provider["incidents"] = []
        for model in provider["models"].values():
            model["error_rate"] = 0.0
            model.pop("overload_rate", None)
    path = folder / "market-no-failures.yaml"
    path.write_text(yaml.safe_dump(market, sort_keys=False))
    return path


def batch_file(lines: int, *, tag: str) -> bytes:
    """``lines`` chat requests; each names itself as the end user, which the simulator counts
    (GET /_calls), so the test sees every call that reached a provider."""
    rows = []
    for n in range(lines):
        custom_id = f"{tag}-{n:05d}"
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Summarise item {n}."}],
            "max_tokens": 16,
            "user": custom_id,
        }
        rows.append(
            orjson.dumps(
                {
                    "custom_id": custom_id,
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
            )
        )
    return b"\n".join(rows) + b"\n"


def sdk(stack: Stack, key: str = BATCH_KEY) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0, timeout=60)


def batch_submit(client: Any, content: bytes) -> Any:
    uploaded = client.files.create(file=("lines.jsonl", content), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def batch_wait(client: Any, batch_id: str, *, timeout: float, until: Any = None) -> Any:
    """Poll ``batches.retrieve`` until the batch ends (or ``until(batch)`` holds)."""
    ends = ("completed", "failed", "expired", "cancelled")
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ends or (until is not None and until(batch)):
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} still {batch.status}: {batch.request_counts}")
        time.sleep(0.5)


def output_lines(client: Any, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(row) for row in client.files.content(file_id).text.splitlines() if row]


def provider_counts(stack: Stack) -> tuple[Counter[str], Counter[str], int]:
    """Calls received per end user (raw requests), calls served per Idempotency-Key, replays."""
    calls: Counter[str] = Counter()
    served: Counter[str] = Counter()
    replays = 0
    for provider in PROVIDERS:
        url = stack.sim_url(provider)
        calls.update(httpx.get(f"{url}/_calls", timeout=10).json()["by_caller"])
        keys = httpx.get(f"{url}/_idempotency", timeout=10).json()
        served.update(keys["executions"])
        replays += keys["replays"]
    return calls, served, replays


def job_id_of(record: dict[str, Any]) -> str:
    """The line's job (the Idempotency-Key the gateway sent) from its output record's id."""
    return "job-" + record["id"].removeprefix("batch_req_")
