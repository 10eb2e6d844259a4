"""A small market with headroom for switchback tests: one fast endpoint, one cheap but slow,
flaky and short of capacity (its concurrency limit is unknown to the gateway), one in between."""

from __future__ import annotations

from pathlib import Path

CONFIG = """
providers:
  - name: fast
    protocol: openai
    base_url: http://127.0.0.1:1/v1
    limits:
      - {dimension: requests, capacity: 600, per: 1m}
      - {dimension: input_tokens, capacity: 600000, per: 1m}
  - name: cheap
    protocol: openai
    base_url: http://127.0.0.1:2/v1
    limits:
      - {dimension: requests, capacity: 600, per: 1m}
  - name: mid
    protocol: anthropic
    base_url: http://127.0.0.1:3
    limits:
      - {dimension: requests, capacity: 300, per: 1m}
models:
  - slug: t/chat
    default_output_tokens: 300
    endpoints:
      - {provider: fast,  upstream_model: m, price: {input: 0.50, cached_input: 0.05, output: 1.50}, context_window: 131072, max_output: 8192}
      - {provider: cheap, upstream_model: m, price: {input: 0.30, cached_input: 0.30, output: 2.00}, context_window: 131072, max_output: 8192}
      - {provider: mid,   upstream_model: m, price: {input: 0.45, cached_input: 0.10, output: 1.80}, context_window: 131072, max_output: 8192}
workload_classes:
  - {name: interactive, deadline: 10s, max_queue_depth: 100, overload: reject, weight: 8, retry_budget: 2}
"""

MARKET = """
providers:
  - name: fast
    port: 0
    protocol: openai
    limits: {requests_per_minute: 600, input_tokens_per_minute: 600000}
    models:
      m: {ttft_ms: {median: 250, p95: 700}, tokens_per_s: {median: 120, p05: 60}, error_rate: 0.005, cache_hit_rate: 0.5}
  - name: cheap
    port: 0
    protocol: openai
    limits: {requests_per_minute: 600, concurrency: 6}
    models:
      m: {ttft_ms: {median: 900, p95: 3000}, tokens_per_s: {median: 35, p05: 12}, error_rate: 0.03, cache_hit_rate: 0.0}
  - name: mid
    port: 0
    protocol: anthropic
    limits: {requests_per_minute: 300}
    models:
      m: {ttft_ms: {median: 450, p95: 1400}, tokens_per_s: {median: 70, p05: 30}, error_rate: 0.01, cache_hit_rate: 0.35}
traffic:
  duration: 1d
  models:
    t/chat: {requests_per_minute: {mean: 30, diurnal_amplitude: 0.3}, input_tokens: {median: 2000, p95: 10000}, output_tokens: {median: 300, p95: 1000}, tool_share: 0.2, conversation_turns: {mean: 3}}
experiment:
  block: 1h
  warmup: 15m
  seed: 11
"""


def files(directory: Path, market: str = MARKET, config: str = CONFIG) -> tuple[str, str]:
    """Write the config and market files; return their paths."""
    config_path, market_path = directory / "switchyard.yaml", directory / "market.yaml"
    config_path.write_text(config)
    market_path.write_text(market)
    return str(config_path), str(market_path)
