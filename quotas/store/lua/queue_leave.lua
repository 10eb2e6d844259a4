-- queue_leave: a waiter leaves at its deadline or on cancellation (SPEC E1) — unless the pump
-- decided first, in the same instant or before: then it gets that verdict (a grant it owns).
-- KEYS[1] epoch hash, KEYS[2] lease index, KEYS[3..6] the pool's qp:s, qp:h, qp:l, qp:d.
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] qp, ARGV[3] retention (s),
-- ARGV[4] max lease (s), ARGV[5] expiry limit, ARGV[6] reservation id,
-- ARGV[7] reason (deadline | cancelled).
-- Returns {'V', verdict} or {'U', now} when the queue knows nothing of it.
local now = clock(ARGV[1])
local born, learning_until = epoch(KEYS[1], now, tonumber(ARGV[4]))
local id, reason = ARGV[6], ARGV[7]
local Q = q_load(ARGV[2])
local e, raw = q_entry_load(Q, id)
if not e then
  if raw and string.sub(raw, 1, 1) == 'V' then
    redis.call('DEL', Q.qp .. ':e:' .. id)
    return {'V', string.sub(raw, 2)}
  end
  return {'U', fmt(now)}
end
local retry = now
if reason ~= 'cancelled' then retry = q_retry_hint(Q, now) end
local refusal = q_refusal(now, reason, '', retry, id, {})
local was_head = redis.call('ZSCORE', Q.h, id)
q_drop(Q, e, refusal, now, false, false)
if was_head and redis.call('ZCARD', Q.d) > 0 then
  -- It may have held the line: let the others go.
  local ctx = {now = now, born = born, learning_until = learning_until,
               limit = tonumber(ARGV[5]), retention = tonumber(ARGV[3]), index = KEYS[2]}
  q_pump(Q, ctx, nil)
end
return {'V', refusal}
