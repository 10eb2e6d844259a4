-- The fair queue's steps (SPEC D2, E1, E6), shared by queue_admit, queue_pump, queue_leave and
-- queue_settle; prepended after lib.lua. Mirrors quotas/core/queuebook.py step by step.
-- Units: times epoch s, tags virtual time (tokens / weight), amounts bucket units, TTLs ms.
--
-- Keys of one pool, qp = '<prefix>:{<pool>}:q'; a flow's waiters wait in FIFO lanes, one per
-- holder of their own limits (core: fairqueue.lane_of, given by the caller); a lane's name in
-- the pool is <lk> = <flow> .. '\31' .. <lane> (core: fairqueue.lane_key):
--   qp:s       hash   v (virtual time), nf (last next fit), f:<flow> (finish tag of its last grant)
--   qp:h       zset   head entry id -> start tag (one head per flow with a lane not parked:
--                     the first waiter of the first lane of its ring)
--   qp:l       zset   flow -> number of waiters in all its lanes (longest flow for eviction)
--   qp:d       zset   entry id -> deadline (every waiter)
--   qp:p       zset   <lk> -> when its own limit fits again (parked: out of its flow's ring)
--   qp:r:<flow> list  the flow's non-empty lanes not parked, round robin: a lane whose head is
--                     granted or leaves goes to the back. The ring's FIRST lane is the list's
--                     LAST element, so that turn is one RPOPLPUSH (and the back is LPUSH).
--   qp:n:<flow> set   the flow's non-empty lanes, parked or not (eviction takes from the longest)
--   qp:f:<lk>  list   entry ids, FIFO
--   qp:e:<id>  string 'Q' .. msgpack entry while waiting; 'V' .. verdict once decided
-- Entry and bucket keys are read from the entries (standalone Redis only, as reap.lua does).
-- A verdict is a \31-joined reply: a grant (q_grant_reply: packed, or as reserve.lua's 'G'
-- reply for an entry of the version before), or a refusal
-- {'Q', now, reason, bucket, retry_at, queue_id, k, (name, reason, retry_at)*k}. Waiters'
-- processes get {id .. \31 .. verdict} in their mailbox list.
-- A mailbox is alive while the string <mailbox>:alive holds a time after now: set when one of
-- its waiters joins, and by its process's listener on every BLPOP cycle (queue_redis.py).

local MAX_VISITS = 32
local MAX_GRANTS = 16
local UNPARK_LIMIT = 64
local SWEEP_LIMIT = 16
local EARLY_LIMIT = 16
local DRAIN_SCAN = 64
local DRAIN_MARGIN = 0.001
local VERDICT_SECONDS = 60
local MAILBOX_MS = 120000
-- = fairqueue.MAILBOX_ALIVE_SECONDS: a mailbox not marked for this long has no reader.
local ALIVE_SECONDS = 5
local SEP = '\31'

local function q_keys(qp)
  return {qp = qp, s = qp .. ':s', h = qp .. ':h', l = qp .. ':l', d = qp .. ':d',
          p = qp .. ':p', fin = {}}
end

-- An entry as stored: {id, flow, weight, cost, burst, deadline, lease, mailbox, rkey, parts,
-- lane, packed} with parts[i] = {blob, amount, key, hkey, pkey, side}; side (core:
-- fairqueue.Side) is 0 shared with other flows, 1 the pool's, 2 the flow's own. A packed
-- bucket's key is stored as the hash layout's (':b:', lib.lua hash_layout_key), so that a
-- gateway of the version before, pumping during a deploy, takes from the hash it reads; this
-- version's scripts use the packed key. packed: 1 when the entry's process reads a packed
-- grant (q_grant_reply); missing in an entry of the version before.
local function q_entry_load(Q, id)
  local raw = redis.call('GET', Q.qp .. ':e:' .. id)
  if not raw or string.sub(raw, 1, 1) ~= 'Q' then return nil, raw end
  local t = cmsgpack.unpack(string.sub(raw, 2))
  for _, row in ipairs(t[10]) do
    local p = read_part(row[1])
    if PACKED[p.rule] then row[3] = packed_layout_key(p, row[3]) end
  end
  return {id = t[1], flow = t[2], weight = t[3], cost = t[4], burst = t[5], deadline = t[6],
          lease = t[7], mailbox = t[8], rkey = t[9], parts = t[10], lane = t[11] or '',
          packed = t[12] == 1}, raw
end

local function q_entry_pack(e)
  local rows = {}
  for i, row in ipairs(e.parts) do
    local p = read_part(row[1])
    if PACKED[p.rule] then
      rows[i] = {row[1], row[2], hash_layout_key(p, row[3]), row[4], row[5], row[6]}
    else
      rows[i] = row
    end
  end
  return 'Q' .. cmsgpack.pack({e.id, e.flow, e.weight, e.cost, e.burst, e.deadline, e.lease,
                               e.mailbox, e.rkey, rows, e.lane, 1})
end

-- The parts as reserve_parts wants them.
local function q_parts(e)
  local parts = {}
  for i, row in ipairs(e.parts) do
    parts[i] = read_part(row[1], {amount = row[2], key = row[3], hkey = row[4], pkey = row[5],
                                  side = row[6] == 1, own = row[6] == 2})
  end
  return parts
end

-- Entries and flows outlive their deadlines by a day (the pool's own keys live a day after
-- its last use), so they are swept by the pump, never lost to a TTL while referenced.
local KEEP_MS = 86400000

-- Keep the pool's own keys alive while it is in use (a day after the last grant or join).
local function q_touch(Q)
  for _, k in ipairs({Q.s, Q.h, Q.l, Q.d, Q.p}) do redis.call('PEXPIRE', k, KEEP_MS) end
end

local function q_finish(Q, flow)
  local f = Q.fin[flow]  -- read by q_load (false: none), or nil: not read yet
  if f == nil then f = redis.call('HGET', Q.s, 'f:' .. flow) end
  if f then return tonumber(f) end
  return -INF
end

local function q_start(Q, e)
  return math.max(q_finish(Q, e.flow), Q.v - e.burst / e.weight)
end

-- A grant counts against its flow: finish tag and virtual time move on.
local function q_account(Q, e, s)
  Q.v = math.max(Q.v, s)
  local finish = fmt(s + e.cost / e.weight)
  redis.call('HSET', Q.s, 'f:' .. e.flow, finish, 'v', fmt(Q.v))
  Q.fin[e.flow] = finish
  redis.call('PEXPIRE', Q.s, KEEP_MS)
end

local function q_retry_hint(Q, now)
  if Q.nf > now and Q.nf < INF then return Q.nf end
  return now
end

local function q_set_head(Q, e)
  redis.call('ZADD', Q.h, fmt(q_start(Q, e)), e.id)
end

local function q_lk(flow, lane)
  return flow .. SEP .. lane
end

local function q_lane_key(Q, flow, lane)
  return Q.qp .. ':f:' .. q_lk(flow, lane)
end

-- One waiter more (by = 1) or fewer (by = -1) in a flow.
local function q_count(Q, flow, by)
  if tonumber(redis.call('ZINCRBY', Q.l, by, flow)) <= 0 then redis.call('ZREM', Q.l, flow) end
end

-- A lane with no waiters left: out of its flow's lanes (a parked one stays parked, as in the
-- core: until due, or until the lane starts afresh).
local function q_lane_gone(Q, flow, lane)
  redis.call('SREM', Q.qp .. ':n:' .. flow, lane)
end

-- The flow's head: the first waiter of the first lane of its ring (none when all its lanes are
-- parked or empty). lane, id: the ring's first lane and its first waiter, if the caller knows.
local function q_promote(Q, flow, lane, id)
  local rkey = Q.qp .. ':r:' .. flow
  lane = lane or redis.call('LINDEX', rkey, -1)
  while lane do
    local lkey = q_lane_key(Q, flow, lane)
    id = id or redis.call('LINDEX', lkey, 0)
    if not id then
      redis.call('RPOP', rkey)  -- emptied by healing: out of the ring
      q_lane_gone(Q, flow, lane)
      lane = redis.call('LINDEX', rkey, -1)
    else
      local e = q_entry_load(Q, id)
      if e then q_set_head(Q, e); return end
      redis.call('LPOP', lkey)  -- its key is gone (a day past its deadline): heal
      redis.call('ZREM', Q.d, id)
      q_count(Q, flow, -1)
      id = nil
    end
  end
end


-- The mark is a time on the scripts' clock, not a TTL: the core compares it with now just so.
-- The key's own TTL only cleans it up once its process is long gone.
local function q_keep_alive(mailbox, now)
  redis.call('SET', mailbox .. ':alive', fmt(now + ALIVE_SECONDS), 'PX', MAILBOX_MS)
end

-- Is someone still reading the mailbox? seen: answers already read in this call.
local function q_alive(mailbox, now, seen)
  local alive = seen[mailbox]
  if alive == nil then
    local till = redis.call('GET', mailbox .. ':alive')
    alive = (till and tonumber(till) > now) or false
    seen[mailbox] = alive
  end
  return alive
end

local function q_join(Q, e, now)
  q_keep_alive(e.mailbox, now)  -- its process is alive: it is entering
  local lkey = q_lane_key(Q, e.flow, e.lane)
  local ttl = math.ceil(math.max(0, math.min(e.deadline - now, 8 * 86400)) * 1000) + KEEP_MS
  redis.call('SET', Q.qp .. ':e:' .. e.id, q_entry_pack(e), 'PX', ttl)
  local n = redis.call('RPUSH', lkey, e.id)
  redis.call('PEXPIRE', lkey, KEEP_MS)
  redis.call('ZADD', Q.d, fmt(e.deadline), e.id)
  q_count(Q, e.flow, 1)
  if n == 1 then
    -- Parked for a request that is gone: start afresh, at the back of the ring.
    redis.call('ZREM', Q.p, q_lk(e.flow, e.lane))
    local rkey, nkey = Q.qp .. ':r:' .. e.flow, Q.qp .. ':n:' .. e.flow
    local lanes = redis.call('LPUSH', rkey, e.lane)
    redis.call('SADD', nkey, e.lane)
    redis.call('PEXPIRE', rkey, KEEP_MS)
    redis.call('PEXPIRE', nkey, KEEP_MS)
    if lanes == 1 then q_set_head(Q, e) end
  end
  q_touch(Q)
end

-- Take e out of its lane (the head's lane goes to the back of the ring, and the ring's first
-- lane puts up the next head), keep its verdict, tell its process.
local function q_drop(Q, e, verdict, now, notify, keep)
  local lkey = q_lane_key(Q, e.flow, e.lane)
  local rkey = Q.qp .. ':r:' .. e.flow
  redis.call('ZREM', Q.d, e.id)
  if redis.call('ZREM', Q.h, e.id) == 1 then
    redis.call('LPOP', lkey)
    local nxt = redis.call('LINDEX', lkey, 0)
    -- The head's lane is the ring's first: to the back if it still has waiters, else out.
    if not nxt then
      redis.call('RPOP', rkey)
      q_lane_gone(Q, e.flow, e.lane)
      q_promote(Q, e.flow)
    else
      local second = redis.call('LINDEX', rkey, -2)
      if second then
        redis.call('RPOPLPUSH', rkey, rkey)
        q_promote(Q, e.flow, second)
      else
        q_promote(Q, e.flow, e.lane, nxt)  -- its flow's one lane: it stays first
      end
    end
  else
    redis.call('LREM', lkey, 1, e.id)
    if redis.call('LLEN', lkey) == 0 then
      q_lane_gone(Q, e.flow, e.lane)
      if not redis.call('ZSCORE', Q.p, q_lk(e.flow, e.lane)) then
        redis.call('LREM', rkey, 1, e.lane)
      end
    end
  end
  q_count(Q, e.flow, -1)
  local ekey = Q.qp .. ':e:' .. e.id
  if keep then
    redis.call('SET', ekey, 'V' .. verdict, 'PX', math.ceil((e.lease + VERDICT_SECONDS) * 1000))
  else
    redis.call('DEL', ekey)
  end
  if notify then
    redis.call('RPUSH', e.mailbox, e.id .. SEP .. verdict)
    redis.call('PEXPIRE', e.mailbox, MAILBOX_MS)
  end
end

-- A reply ending in refusal rows (bucket, reason, retry at): a refusal's, or a grant's shadow
-- refusals in either grant format.
local function q_with_rows(out, rows)
  for _, row in ipairs(rows) do
    out[#out + 1] = row[1]
    out[#out + 1] = row[2]
    out[#out + 1] = fmt(row[3])
  end
  return table.concat(out, SEP)
end

local function q_refusal(now, reason, bucket, retry_at, queue_id, rows)
  return q_with_rows({'Q', fmt(now), reason, bucket, fmt(retry_at), queue_id, #rows}, rows)
end

-- A grant for a process of this version (packed): 'g' then struct.pack of now (double), n
-- (byte) and per part its marker (double), skipped (byte) and remaining (double): no number
-- formatted here nor parsed there (quotas/store/wire.py parse_packed_grant); then \31, the
-- shadow refusals' count and rows as text, as in a refusal.
local grant_formats = {}

local function q_grant_packed(now, n, res)
  local f = grant_formats[n]
  if not f then
    f = '<dB' .. string.rep('dBd', n)
    grant_formats[n] = f
  end
  local values, at = {now, n}, 2
  for i = 1, n do
    local t = res.taken[i]
    values[at + 1], values[at + 2], values[at + 3] = t[2], t[3], t[4]
    at = at + 3
  end
  local out = {'g' .. struct.pack(f, unpack(values, 1, at)), #res.shadow}
  return q_with_rows(out, res.shadow)
end

-- packed: the waiter's process reads packed grants (else reserve.lua's 'G' reply, \31-joined:
-- an entry of the version before).
local function q_grant_reply(now, n, res, packed)
  if packed then return q_grant_packed(now, n, res) end
  local out = {'G', fmt(now), n}
  for i = 1, n do
    local marker = res.taken[i][2]
    if marker == 0 then out[#out + 1] = '0' else out[#out + 1] = fmt(marker) end
    out[#out + 1] = tostring(res.taken[i][3])
    out[#out + 1] = fmt(res.taken[i][4])
  end
  out[#out + 1] = #res.shadow
  return q_with_rows(out, res.shadow)
end

-- Write the lease exactly as reserve.lua does; the grant reply for the waiter.
local function q_lease(ctx, e, parts, res)
  local rec = record_new(e.id, ctx.now, ctx.expiry, parts, res.taken)
  record_write(e.rkey, rec, ctx.now, ctx.retention)
  redis.call('ZADD', ctx.index, ctx.expiry, e.rkey)
  return q_grant_reply(ctx.now, #parts, res, e.packed)
end

-- A lower bound on when a refused request can be admitted (core: earliest_admission):
-- concurrency may free sooner by a release; a ramp's inf only means "not next interval".
local function q_floor(parts, res, now, pool_only)
  local rule_of = {}
  for _, p in ipairs(parts) do
    if p.side or not pool_only then rule_of[p.name] = p.rule end
  end
  local floor = now
  for _, row in ipairs(res.live) do
    local rule = rule_of[row[1]]
    if rule and rule ~= 'concurrency' and not (rule == 'ramp' and row[3] == INF) then
      floor = math.max(floor, row[3])
    end
  end
  return floor
end

-- What waiting cannot fix: too big, the state being relearnt, or the next fit past the
-- deadline. nil: keep waiting.
local function q_unreachable(e, parts, res, now, queue_id)
  if res.reason == 'unsatisfiable' then
    return q_refusal(now, 'unsatisfiable', res.bucket, INF, '', res.live)
  end
  -- The state was lost: no waiting in line behind that (core: fairqueue.unreachable).
  for _, row in ipairs(res.live) do
    if row[2] == 'recovering' then
      return q_refusal(now, 'recovering', row[1], row[3], '', res.live)
    end
  end
  local floor = q_floor(parts, res, now, false)
  if floor <= e.deadline then return nil end
  local bucket = res.bucket
  for _, row in ipairs(res.live) do
    if row[3] == floor then bucket = row[1]; break end
  end
  return q_refusal(now, 'deadline_unreachable', bucket, res.retry, queue_id, res.live)
end

-- Lanes whose own limit fits again rejoin their flow's ring, at its back; a flow that had no
-- head gets one, at most its burst credit behind V.
local function q_unpark(Q, now)
  local due = redis.call('ZRANGEBYSCORE', Q.p, '-inf', fmt(now), 'LIMIT', 0, UNPARK_LIMIT)
  for _, lk in ipairs(due) do
    redis.call('ZREM', Q.p, lk)
    local flow, lane = string.match(lk, '^(.*)\31([^\31]*)$')
    if redis.call('EXISTS', Q.qp .. ':f:' .. lk) == 1 then  -- unless its waiters are gone
      if redis.call('LPUSH', Q.qp .. ':r:' .. flow, lane) == 1 then q_promote(Q, flow) end
    end
  end
end

local function q_ctx(ctx, e)
  ctx.id, ctx.expiry = e.id, ctx.now + e.lease
  return ctx
end

-- The pump: hand out what fits in start-tag order. ctx = {now, born, learning_until, limit,
-- retention, index}. Returns next_fit, granted, refused and the newcomer's verdict (or nil).
local function q_pump(Q, ctx, newcomer)
  local now = ctx.now
  local mine, refused = nil, 0
  local function decide(e, verdict, keep)
    local me = e.id == newcomer
    q_drop(Q, e, verdict, now, not me, keep and not me)
    if me then mine = verdict end
  end
  local due = redis.call('ZRANGEBYSCORE', Q.d, '-inf', fmt(now), 'LIMIT', 0, SWEEP_LIMIT)
  for _, id in ipairs(due) do
    local e = q_entry_load(Q, id)
    if e then
      decide(e, q_refusal(now, 'deadline', '', q_retry_hint(Q, now), id, {}), true)
      refused = refused + 1
    else
      redis.call('ZREM', Q.d, id)
    end
  end
  q_unpark(Q, now)
  local blocked, skipped, seen = {}, {}, {}
  local offset, visits, granted = 0, 0, 0
  local next_fit, stopped_at, exhausted = INF, -1, false
  while visits < MAX_VISITS and granted < MAX_GRANTS do
    local row = redis.call('ZRANGE', Q.h, offset, offset, 'WITHSCORES')
    if #row == 0 then exhausted = true; break end
    visits = visits + 1
    local id, s = row[1], tonumber(row[2])
    local e = q_entry_load(Q, id)
    if not e then
      redis.call('ZREM', Q.h, id)  -- lost its entry (expired key): heal
    elseif e.deadline <= now then
      decide(e, q_refusal(now, 'deadline', '', q_retry_hint(Q, now), id, {}), true)
      refused = refused + 1
    elseif not q_alive(e.mailbox, now, seen) then
      -- Its process stopped reading (crashed): a grant would hold capacity nobody uses until
      -- the lease expires. It leaves, taking nothing; its flow moves on.
      decide(e, q_refusal(now, 'abandoned', '', now, id, {}), true)
      refused = refused + 1
    else
      local parts = q_parts(e)
      local held = false
      for _, p in ipairs(parts) do
        if blocked[p.key] then held = true; break end
      end
      if held then
        skipped[e.flow] = true
        offset = offset + 1
      else
        local res = reserve_parts(q_ctx(ctx, e), parts)
        if res.ok then
          q_account(Q, e, s)
          decide(e, q_lease(ctx, e, parts, res), true)
          granted = granted + 1
        else
          local late = q_unreachable(e, parts, res, now, id)
          if late then
            decide(e, late, true)
            refused = refused + 1
          else
            local names, by_pool, all_own = {}, false, true
            for _, r in ipairs(res.live) do names[r[1]] = true end
            for _, p in ipairs(parts) do
              if names[p.name] then
                if p.side then by_pool = true end
                if not p.own then all_own = false end
              end
            end
            next_fit = math.min(next_fit, res.retry)
            if by_pool then
              stopped_at = q_floor(parts, res, now, true)
              break
            end
            if all_own and q_floor(parts, res, now, false) == res.retry then
              -- Held by its own limit until a known time: its lane is not backlogged till
              -- then (parked), and the next lane of its flow puts its first waiter up.
              redis.call('ZREM', Q.h, id)
              redis.call('ZADD', Q.p, fmt(res.retry), q_lk(e.flow, e.lane))
              redis.call('RPOP', Q.qp .. ':r:' .. e.flow)  -- the head's lane is the ring's first
              q_promote(Q, e.flow)
              -- Its new head may have a tag among those already passed, and not be tried in
              -- this call: the flow is not told it is doomed behind a later head.
              skipped[e.flow] = true
            else
              for _, p in ipairs(parts) do
                if names[p.name] then blocked[p.key] = true end
              end
              skipped[e.flow] = true
              offset = offset + 1
            end
          end
        end
      end
    end
  end
  if stopped_at < 0 and not exhausted then next_fit = now end
  local first_parked = redis.call('ZRANGE', Q.p, 0, 0, 'WITHSCORES')
  if first_parked[2] then next_fit = math.min(next_fit, tonumber(first_parked[2])) end
  if stopped_at > now then
    -- Nobody behind the stuck head can pass it before stopped_at: tell the doomed now.
    local doomed = redis.call('ZRANGEBYSCORE', Q.d, '-inf', '(' .. fmt(stopped_at), 'LIMIT', 0,
      EARLY_LIMIT)
    for _, id in ipairs(doomed) do
      local e = q_entry_load(Q, id)
      if e and not skipped[e.flow] and not redis.call('ZSCORE', Q.p, q_lk(e.flow, e.lane)) then
        decide(e, q_refusal(now, 'deadline_unreachable', '', stopped_at, id, {}), true)
        refused = refused + 1
      end
    end
  end
  local depth = redis.call('ZCARD', Q.d)
  if depth == 0 then next_fit = INF end
  Q.nf = next_fit
  redis.call('HSET', Q.s, 'nf', fmt(next_fit))
  return next_fit, granted, refused, mine, depth
end

-- E6: a newcomer whose own lane's waiters ahead use up the pool's refill past its deadline
-- is refused now, not at the deadline (core: QueueBook._drain_refusal, fairqueue.drain_floor).
-- Only refill buckets of requests and input tokens count: what a request takes there it keeps.
local function q_drain_refusal(Q, e, parts, ctx)
  local now = ctx.now
  local specs, names = {}, {}
  for _, p in ipairs(parts) do
    if p.side and p.rule == 'refill' and not p.shadow
        and (p.dim == 'requests' or p.dim == 'input_tokens') then
      specs[#specs + 1] = p
      names[#names + 1] = p.name
    end
  end
  local fkey = q_lane_key(Q, e.flow, e.lane)
  local n = redis.call('LLEN', fkey)
  if #specs == 0 or n < 2 then return nil end
  local avail, rate, used = {}, {}, {}
  for i, p in ipairs(specs) do
    avail[i] = view(p, p.key, p.hkey, now, ctx.born, ctx.limit).avail
    rate[i] = p.cap / p.period
    used[i] = 0
  end
  local function fit(amounts)
    local when, which = now, 0
    for i = 1, #specs do
      local short = used[i] + amounts[i] - avail[i]
      if short > 0 and rate[i] > 0 and now + short / rate[i] > when then
        when, which = now + short / rate[i], i
      end
    end
    return when, which
  end
  local ids = redis.call('LRANGE', fkey, 0, math.min(n - 1, DRAIN_SCAN) - 1)
  for _, id in ipairs(ids) do
    local other = q_entry_load(Q, id)
    if other then
      local by_name = {}
      for _, row in ipairs(other.parts) do by_name[read_part(row[1]).name] = row[2] end
      local amounts = {}
      for i, name in ipairs(names) do amounts[i] = by_name[name] or 0 end
      if fit(amounts) <= other.deadline - DRAIN_MARGIN then
        for i = 1, #specs do used[i] = used[i] + amounts[i] end
      end
    end
  end
  local own = {}
  for i, p in ipairs(specs) do own[i] = p.amount end
  local floor, which = fit(own)
  if floor <= e.deadline - DRAIN_MARGIN then return nil end
  return q_refusal(now, 'deadline_unreachable', names[which], floor, e.id, {})
end

-- flow: the flow whose finish tag the caller needs (admit), read in the same HMGET.
local function q_load(qp, flow)
  local Q = q_keys(qp)
  local st = redis.call('HMGET', Q.s, 'v', 'nf', flow and ('f:' .. flow) or 'v')
  Q.v, Q.nf = tonumber(st[1] or '0'), tonumber(st[2] or '0')
  if flow then Q.fin[flow] = st[3] end
  return Q
end


local function q_pumped(now, next_fit, granted, refused, depth)
  return {fmt(now), fmt(next_fit), depth, granted, refused}
end
