-- queue_admit: grant at once when nobody waits and it fits (one round trip, like reserve.lua);
-- otherwise join the pool's fair queue and run the pump (SPEC D2, E1, E6).
-- KEYS[1] epoch hash, KEYS[2] lease index, KEYS[3] the parts' spec key (lib.lua specs_load:
-- per part its bucket blob, bucket hash, holders zset, scope's pause key and side — 0 shared,
-- 1 pool, 2 own —, the request's lane in its flow, fairqueue.lane_of, and the lease record's
-- key prefix).
-- The pool's qp:s, qp:h, qp:l, qp:d (queue_lib.lua) are made from qp.
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] reservation id, ARGV[3] flow,
-- ARGV[4] weight, ARGV[5] cost (tokens), ARGV[6] burst (tokens), ARGV[7] deadline (epoch s),
-- ARGV[8] lease (s), ARGV[9] mailbox key, ARGV[10] max depth, ARGV[11] flow depth, ARGV[12]
-- the spec set's definition or '', then ARGV[12 + i] part i's amount. qp, retention (s), max
-- lease (s) and expiry limit come from the spec set.
-- Returns {'V', verdict} (granted or refused, queue_lib.lua format), {'W', now, id, next_fit}
-- (waiting; the verdict comes to the mailbox), reserve.lua's 'P' replay, or {'S'} when the
-- spec key is unknown (nothing done).
local specs = specs_load(KEYS[3], ARGV[12])
if not specs then return {'S'} end
local now = clock(ARGV[1])
local id, flow = ARGV[2], ARGV[3]
local deadline, lease = tonumber(ARGV[7]), tonumber(ARGV[8])
local max_depth, flow_depth = tonumber(ARGV[10]), tonumber(ARGV[11])
local retention = specs[5]
local born, learning_until = epoch(KEYS[1], now, specs[6])
local n = specs[1]
local rkey = specs[3] .. id

local rec = record_load(rkey, now, retention)
if rec then return record_replay(rec, now) end

local Q = q_load(specs[4], flow)
local depth = redis.call('ZCARD', Q.d)
if depth > 0 and q_entry_load(Q, id) then return {'W', fmt(now), id, fmt(Q.nf)} end

-- The parts straight from the spec set (their fields cached with it); the entry's rows
-- (queue_lib.lua q_entry_pack) are made only when it joins the queue.
local parts = {}
for i = 1, n do
  local p = spec_part(specs, i)
  p.amount = tonumber(ARGV[12 + i])
  parts[i] = p
end
local e = {id = id, flow = flow, weight = tonumber(ARGV[4]), cost = tonumber(ARGV[5]),
           burst = tonumber(ARGV[6]), deadline = deadline, lease = lease, mailbox = ARGV[9],
           rkey = rkey, lane = specs[2], packed = true}

local function join()
  local rows = {}
  for i = 1, n do
    local at = 8 + 5 * (i - 1)
    rows[i] = {specs[at], parts[i].amount, specs[at + 1], specs[at + 2], specs[at + 3],
               specs[at + 4]}
  end
  e.parts = rows
  q_join(Q, e, now)
end
for _, p in ipairs(parts) do
  if not p.shadow and p.rule ~= 'ramp' and p.amount > p.cap then
    return {'V', q_refusal(now, 'unsatisfiable', p.name, INF, '', {})}
  end
end
if deadline <= now then return {'V', q_refusal(now, 'deadline', '', now, id, {})} end

local ctx = {now = now, born = born, learning_until = learning_until,
             limit = specs[7], retention = retention, index = KEYS[2]}
local no_wait = max_depth <= 0 or flow_depth <= 0
if depth == 0 then
  local res = reserve_parts(q_ctx(ctx, e), parts)
  if res.ok then
    q_account(Q, e, q_start(Q, e))
    return {'V', q_lease(ctx, e, parts, res)}
  end
  local late = q_unreachable(e, parts, res, now, id)
  if late then return {'V', late} end
  if no_wait then
    return {'V', q_refusal(now, res.reason, res.bucket, res.retry, '', res.live)}
  end
  join()
  redis.call('HSET', Q.s, 'nf', fmt(res.retry))
  return {'W', fmt(now), id, fmt(res.retry)}
end
if not no_wait then
  local waiting = tonumber(redis.call('ZSCORE', Q.l, flow) or '0')
  if waiting >= flow_depth then
    return {'V', q_refusal(now, 'flow_full', '', q_retry_hint(Q, now), id, {})}
  end
  if redis.call('ZCARD', Q.d) >= max_depth then
    local top = redis.call('ZREVRANGE', Q.l, 0, 0, 'WITHSCORES')
    if tonumber(top[2]) <= waiting + 1 then
      return {'V', q_refusal(now, 'queue_full', '', q_retry_hint(Q, now), id, {})}
    end
    -- The newest waiter of its longest lane (ties: the greatest lane, as the core's max).
    local lane, most = nil, -1
    for _, name in ipairs(redis.call('SMEMBERS', Q.qp .. ':n:' .. top[1])) do
      local len = redis.call('LLEN', q_lane_key(Q, top[1], name))
      if len > most or (len == most and name > lane) then lane, most = name, len end
    end
    local victim = q_entry_load(Q, redis.call('LINDEX', q_lane_key(Q, top[1], lane), -1))
    local refusal = q_refusal(now, 'queue_full', '', q_retry_hint(Q, now), victim.id, {})
    q_drop(Q, victim, refusal, now, true, true)
  end
end
join()
local next_fit, _, _, mine = q_pump(Q, ctx, id)
if mine then return {'V', mine} end
local refusal
if no_wait then
  refusal = q_refusal(now, 'queue_full', '', q_retry_hint(Q, now), id, {})
else
  refusal = q_drain_refusal(Q, e, parts, ctx)
end
if refusal then
  q_drop(Q, e, refusal, now, false, false)
  return {'V', refusal}
end
return {'W', fmt(now), id, fmt(next_fit)}
