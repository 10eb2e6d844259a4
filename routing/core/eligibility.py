"""Which endpoints may serve a request (SPEC G13, F5): context, max output, filters, features.

Refusal reasons (for the G15 explanation): not_in_only, ignored, context_window (the estimated
input does not fit), max_output (below the request's max_tokens), max_price,
unsupported:<features> (require_parameters), no_tools / no_response_format (the feature asked
and other endpoints declare it), no_embeddings / embeddings_only (an endpoint that embeds serves
embeddings and nothing else), plus inactive from the table.
"""

from __future__ import annotations

from routing.core.catalogue import EndpointConfig
from routing.core.overrides import ProviderPreferences
from routing.core.table import ModelTable

# Features a request needs the endpoint to honour, not merely accept (see ``candidates``).
PREFERRED_FEATURES = ("tools", "response_format")
# Not a feature but an operation: vectors, not text. Strict both ways, whatever the preferences.
EMBEDDINGS = "embeddings"


def candidates(
    table: ModelTable,
    prefs: ProviderPreferences,
    features: frozenset[str],
    tokens_in: float,
    max_tokens: int | None,
    refused: list[tuple[str, str]],
    *,
    plain: bool = False,
) -> list[int]:
    """Indices of the endpoints that can serve the request; the others go to ``refused``.

    ``plain`` says the request has no provider preferences (the fast path skips the loop when
    every endpoint fits the request).
    """
    if (
        plain
        and tokens_in <= table.min_context
        and (max_tokens is None or max_tokens <= table.min_max_output)
        and features <= table.all_supports
        and (EMBEDDINGS in features or EMBEDDINGS not in table.any_supports)
    ):
        return list(range(len(table.endpoints)))
    embeds = EMBEDDINGS in features
    only, ignore = prefs.only, prefs.ignore
    cand = []
    for i, e in enumerate(table.endpoints):
        reason = ""
        if embeds != (EMBEDDINGS in e.supports):
            reason = "no_embeddings" if embeds else "embeddings_only"
        elif only is not None and e.provider not in only and e.id not in only:
            reason = "not_in_only"
        elif e.provider in ignore or e.id in ignore:
            reason = "ignored"
        elif e.context_window < tokens_in:
            reason = "context_window"
        elif max_tokens is not None and e.max_output < max_tokens:
            reason = "max_output"
        elif over_max_price(e, prefs):
            reason = "max_price"
        elif prefs.require_parameters and not features <= e.supports:
            reason = "unsupported:" + ",".join(sorted(features - e.supports))
        if reason:
            refused.append((e.id, reason))
        else:
            cand.append(i)
    if not prefs.require_parameters:
        for feature in (f for f in PREFERRED_FEATURES if f in features):
            # OpenRouter routes tool calls to tool-capable endpoints on a best-effort basis: only
            # when some candidate declares the feature are the others dropped. A response_format
            # is treated alike: an endpoint that ignores it answers prose to a JSON parser.
            able = [i for i in cand if feature in table.endpoints[i].supports]
            if able and len(able) < len(cand):
                dropped = (i for i in cand if i not in able)
                refused.extend((table.endpoints[i].id, "no_" + feature) for i in dropped)
                cand = able
    return cand


def over_max_price(endpoint: EndpointConfig, prefs: ProviderPreferences) -> bool:
    """max_price (USD per million tokens): listed prompt or completion price above it."""
    prompt, completion = prefs.max_price_prompt, prefs.max_price_completion
    if prompt is not None and endpoint.price_input > prompt:
        return True
    return completion is not None and endpoint.price_output > completion
