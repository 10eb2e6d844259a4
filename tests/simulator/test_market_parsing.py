"""Market file parsing: the reference file loads unchanged; bad input names the field path."""

from pathlib import Path

import pytest
import yaml

from simulator.model import MarketError, parse_duration, parse_market, parse_market_text

REFERENCE = Path(__file__).resolve().parents[2] / "config" / "market.yaml"
SATURATED = REFERENCE.parent / "market-saturated.yaml"
# config/ holds the shared examples plus one line each: alpha's embed-small, which the gateway's
# configuration serves and the examples do not describe.
OWN_LINE = "# not in ../shared/examples"


def reference() -> dict:
    return yaml.safe_load(REFERENCE.read_text())


def error_of(data) -> MarketError:
    with pytest.raises(MarketError) as caught:
        parse_market(data)
    return caught.value


EXAMPLES = REFERENCE.parents[1] / "docs" / "examples"  # ../shared/examples, copied unchanged


def shared_examples() -> Path | None:
    """``../shared/examples`` beside the checkout (a worktree may sit one level deeper)."""
    for parent in REFERENCE.resolve().parents:
        if (parent / "shared" / "examples" / "market.yaml").is_file():
            return parent / "shared" / "examples"
    return None


@pytest.mark.parametrize("name", ["market.yaml", "market-saturated.yaml", "switchyard.yaml"])
def test_docs_examples_are_the_shared_examples_unchanged(name: str):
    examples = shared_examples()
    if examples is None:
        pytest.skip("../shared/examples is not beside this checkout (a clean clone)")
    assert (EXAMPLES / name).read_bytes() == (examples / name).read_bytes()


@pytest.mark.parametrize("ours", [REFERENCE, SATURATED], ids=lambda p: p.name)
def test_config_holds_the_shared_example_plus_only_the_embeddings_line(ours: Path):
    lines = ours.read_text().splitlines()
    own = [line for line in lines if OWN_LINE in line]
    assert len(own) == 1 and own[0].strip().startswith("embed-small:")
    shared = (EXAMPLES / ours.name).read_text()
    assert [line for line in lines if OWN_LINE not in line] == shared.splitlines()
    # The example itself loads unchanged, and describes the same market but for the one model.
    theirs, mine = parse_market_text(shared), parse_market_text(ours.read_text())
    assert set(mine.provider("alpha").models) - set(theirs.provider("alpha").models) == {
        "embed-small"
    }
    assert mine.traffic == theirs.traffic and mine.experiment == theirs.experiment


@pytest.mark.parametrize(
    ("path", "large_rpm", "small_rpm", "whale_rpm"),
    [(REFERENCE, 90, 150, 270), (SATURATED, 300, 500, 900)],
    ids=["market.yaml", "market-saturated.yaml"],
)
def test_it_loads_the_reference_market_unchanged(path, large_rpm, small_rpm, whale_rpm):
    market = parse_market_text(path.read_text())

    assert [p.name for p in market.providers] == ["alpha", "beta", "gamma"]
    alpha, beta, gamma = market.providers
    assert (alpha.port, alpha.protocol, beta.protocol) == (9101, "openai", "anthropic")
    assert alpha.limits.requests_per_minute == 600
    assert alpha.limits.output_tokens_per_minute == 80000
    assert gamma.limits.input_tokens_per_minute is None
    assert gamma.limits.concurrency == 24
    large = alpha.models["chat-large"]
    assert (large.ttft_ms.median_ms, large.ttft_ms.p95_ms) == (450, 1400)
    assert (large.tokens_per_s.median, large.tokens_per_s.p05) == (70, 30)
    assert (large.error_rate, large.cache_hit_rate) == (0.01, 0.35)
    assert beta.models["chat-large-fast"].overload_rate == 0.01
    assert gamma.models["chat-large"].malformed_tool_call_rate == 0.08
    (incident,) = alpha.incidents
    assert (incident.model, incident.at, incident.duration) == ("chat-large", 30 * 3600, 40 * 60)
    assert incident.error_rate == 0.35

    traffic = market.traffic
    assert traffic is not None and traffic.duration == 7 * 86400
    chat_large = traffic.models["acme/chat-large"]
    assert chat_large.requests_per_minute.mean == large_rpm
    assert traffic.models["acme/chat-small"].requests_per_minute.mean == small_rpm
    assert chat_large.requests_per_minute.diurnal_amplitude == 0.5
    assert (chat_large.input_tokens.median, chat_large.input_tokens.p95) == (3000, 24000)
    assert (chat_large.output_tokens.median, chat_large.output_tokens.p95) == (350, 1500)
    assert chat_large.tool_share == 0.3
    assert chat_large.conversation_turns.mean == 4
    assert traffic.models["acme/chat-small"].tool_share == 0.0
    (whale,) = traffic.whales
    assert (whale.model, whale.at, whale.duration) == ("acme/chat-large", 50 * 3600, 2 * 3600)
    assert (whale.requests_per_minute, whale.pinned_provider) == (whale_rpm, "gamma")
    assert market.experiment is not None
    assert (market.experiment.block, market.experiment.warmup) == (3 * 3600, 3600)
    assert market.experiment.seed == 7


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("10s", 10), ("40m", 2400), ("30h", 108000), ("7d", 604800), ("1h30m", 5400)],
)
def test_it_parses_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "40", "40 minutes", "m40", "1w", "-5s"])
def test_it_refuses_durations_without_a_known_unit(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_it_names_the_field_path_of_a_p95_below_the_median():
    data = reference()
    data["providers"][0]["models"]["chat-large"]["ttft_ms"]["p95"] = 100

    error = error_of(data)

    assert error.path == "providers[0].models.chat-large.ttft_ms.p95"
    assert "at least the median" in str(error)


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (lambda d: d["providers"][1].update(protocol="grpc"), "providers[1].protocol"),
        (lambda d: d["providers"][2]["limits"].update(rpm=5), "providers[2].limits.rpm"),
        (
            lambda d: d["providers"][0]["limits"].update(concurrency=-1),
            "providers[0].limits.concurrency",
        ),
        (
            lambda d: d["providers"][0]["models"]["chat-small"].update(error_rate=1.5),
            "providers[0].models.chat-small.error_rate",
        ),
        (
            lambda d: d["providers"][0]["models"]["chat-small"].pop("tokens_per_s"),
            "providers[0].models.chat-small.tokens_per_s",
        ),
        (
            lambda d: d["providers"][0]["incidents"][0].update(model="nope"),
            "providers[0].incidents[0].model",
        ),
        (
            lambda d: d["providers"][0]["incidents"][0].update({"for": "forty"}),
            "providers[0].incidents[0].for",
        ),
        (lambda d: d["providers"][0].update(port="9101"), "providers[0].port"),
        (lambda d: d["providers"][1].update(name="alpha"), "providers[1].name"),
        (
            lambda d: d["traffic"]["whales"][0].update(pinned_provider="delta"),
            "traffic.whales[0].pinned_provider",
        ),
        (
            lambda d: d["traffic"]["models"]["acme/chat-small"].pop("input_tokens"),
            "traffic.models.acme/chat-small.input_tokens",
        ),
        (lambda d: d["experiment"].update(warmup="4h"), "experiment.warmup"),
        (lambda d: d.pop("providers"), "providers"),
    ],
)
def test_it_names_the_field_path_of_bad_input(edit, path):
    data = reference()
    edit(data)

    assert error_of(data).path == path


def test_it_refuses_yaml_that_does_not_parse():
    with pytest.raises(MarketError, match="not valid YAML"):
        parse_market_text("providers: [unclosed")


def test_it_accepts_a_market_without_traffic_and_experiment():
    data = reference()
    del data["traffic"], data["experiment"]

    market = parse_market(data)

    assert market.traffic is None and market.experiment is None


def test_it_reads_optional_model_fields_and_daily_limits():
    data = reference()
    model = data["providers"][0]["models"]["chat-small"]
    model.update(output_tokens={"median": 40, "p95": 90}, max_output_tokens=512, tool_call_rate=1)
    data["providers"][0]["limits"]["requests_per_day"] = 10000

    alpha = parse_market(data).providers[0]

    assert alpha.models["chat-small"].output_tokens.median == 40
    assert alpha.models["chat-small"].max_output_tokens == 512
    assert alpha.models["chat-small"].tool_call_rate == 1.0
    assert alpha.limits.requests_per_day == 10000
