"""The preset dictionary ledger records are deflated with (``ledger.record_encode``).

A record is a few hundred bytes of JSON whose field names, scope kinds and bucket-name shapes
repeat in every record; deflate alone must spell each out once per record, so it gets about 2.8:1
on a proxied request's two records. Primed with the strings they share, it gets about 5.5:1
(about 1,000 bytes to Redis become about 530). The text is a reservation and a generation record
of a request through a config with buckets on key, app, team, tenant and provider, with names,
ids and numbers taken out: what is left is what any configuration's records have in common.

Never edit it: records queued with it must still decode (``ledger.record_decode``). Records are
now compressed with Zstandard primed with the same text (``ledger.ZSTD_PRIMED``). A better one is
a new constant with a new format byte beside those.
"""

DICTIONARY_1 = (
    b'{"kind":"reservation","id":"gen-:1","request_id":"gen-","idempotency_key":"","create'
    b'd_at":0.0,"expires_at":0.0,"queue_deadline":0.0,"tenant_id":0,"app_id":0,"api_key_id'
    b'":0,"model":"","provider":"","workload_class":"interactive","estimated_input_tokens"'
    b':0,"estimated_output_tokens":0,"estimated_total_tokens":0,"estimated_spend":0.0,"tak'
    b'en":{"api_key::requests:1m":0.0,"api_key::total_tokens:day":0.0,"app::concurrency":0'
    b'.0,"app::requests:1m":0.0,"team::requests:1m":0.0,"tenant::requests:1m":0.0,"tenant:'
    b':spend:rolling-5h":0.0,"tenant::total_tokens:day":0.0,"provider::concurrency":0.0,"p'
    b'rovider::input_tokens:1m":0.0,"provider::output_tokens:1m":0.0,"provider::requests:1'
    b'm":0.0,"provider::requests:day":0.0},"outcome":"reconciled","reason_code":"","queue_'
    b'wait_ms":0.0,"actual_input_tokens":0,"actual_cached_input_tokens":0,"actual_output_t'
    b'okens":0,"actual_spend":0.0,"settled":{"api_key::requests:1m":{"released":0.0,"charg'
    b'ed":0.0},"api_key::total_tokens:day":{"released":0.0,"charged":0.0},"app::concurrenc'
    b'y":{"released":0.0,"charged":0.0},"app::requests:1m":{"released":0.0,"charged":0.0},'
    b'"team::requests:1m":{"released":0.0,"charged":0.0},"tenant::requests:1m":{"released"'
    b':0.0,"charged":0.0},"tenant::spend:rolling-5h":{"released":0.0,"charged":0.0},"tenan'
    b't::total_tokens:day":{"released":0.0,"charged":0.0},"provider::concurrency":{"releas'
    b'ed":0.0,"charged":0.0},"provider::input_tokens:1m":{"released":0.0,"charged":0.0},"p'
    b'rovider::output_tokens:1m":{"released":0.0,"charged":0.0},"provider::requests:1m":{"'
    b'released":0.0,"charged":0.0},"provider::requests:day":{"released":0.0,"charged":0.0}'
    b'}}{"kind":"generation","id":"gen-","created_at":0.0,"tenant_id":0,"team_id":0,"app_i'
    b'd":0,"api_key_id":0,"workload_class":"interactive","model":"","provider":"","upstrea'
    b'm_model":"","status":0,"reason_code":"ok","finish_reason":"stop","streamed":false,"c'
    b'ancelled":false,"input_tokens":0,"cached_input_tokens":0,"output_tokens":0,"estimate'
    b'd_input_tokens":0,"estimated_output_tokens":0,"cost":0.0,"latency_ms":0.0,"ttft_ms":'
    b'0.0,"attempts":0,"detail":{"explanation":[],"route":"strategy=routing_cost; winner= '
    b'cost=0.0; runner_up= cost=0.0; sticky=no","shadow_refusals":[],"queue_wait_ms":0.0,"'
    b'degraded_from":"","attempts":[{"provider":"","model":"","outcome":"ok","queue_wait_m'
    b's":0.0,"ms":0.0}],"door":"chat"}}'
)
