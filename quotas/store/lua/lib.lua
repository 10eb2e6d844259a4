-- Bucket arithmetic and reservation steps shared by every script of the reservation store.
-- Units: times are float epoch seconds, amounts are floats in the bucket's dimension, TTLs ms.
-- This file heads the store's Redis function library (quotas/store/library.py: each entry
-- script, reserve.lua, settle.lua, ..., is the body of a function registered after it). Its top
-- level runs once, when the library loads, where Redis offers no globals but `redis` (hence
-- 1/0, not math.huge); the functions run with all of them. It mirrors
-- quotas/core/buckets.py and quotas/core/book.py operation by operation, so that the Redis
-- store and the in-memory twin compute bit-identical floats. A future fair-queue pump script
-- includes it too and calls reserve_parts() for the head request of a flow.
--
-- A bucket travels as one msgpack blob (built and cached in Python): the array
--   {name, rule, dim, capacity, period, x1, x2, x3, x4, shadow(0/1)}
-- x1..x4: fixed_window = four consecutive reset instants; rolling_window x1 = slices;
-- ramp x1 = factor (capacity is the ramp's floor). Each bucket has two KEYS: its hash and its
-- holders sorted set (concurrency: reservation id -> lease expiry); reserve adds the scope's
-- pause key. A refill, fixed window or ramp bucket's state is one string of three doubles
-- (struct.pack PACK3, read with one GET and written with one SET: no number formatted or
-- parsed): refill level/ts/exp, fixed wstart/wend/used, ramp cur/cur_used/prev_used. A
-- rolling window keeps a hash of packed doubles: 'p' = total/lo/hi/exp (PACK4) and s<k> per
-- slice. Concurrency keeps a hash of numbers: held/h:<id>/nx (nx: no holder's lease expires
-- before it, so the holders' sweep is skipped until then; learned limits also lc as of lt,
-- lg = growing). 'exp' = until when the key's TTL is known to run (TTLs only ever drop state
-- that no longer matters, so they are set lazily).
-- The packed buckets' keys say so (quotas/core/keys.py: ':bp:' where the layout before, a
-- hash of numbers, has ':b:'); a packed key that is missing is read from (a rolling window:
-- copied from) the layout before's key, if there is one (packed_legacy, rolling_legacy), so a
-- deploy during traffic keeps what the buckets hold.

local MARGIN_MS = 60000
local HOLDER_SCAN = 256
local TICK = 1e-6
local INF = 1 / 0  -- math.huge: the library's load has no `math`

local function fmt(x)
  return string.format('%.17g', x)
end

local function clock(arg)
  if arg ~= nil and arg ~= '' then
    return tonumber(arg)
  end
  -- The Redis server's clock is the one clock every gateway process shares.
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function ttl_ms(seconds)
  return math.ceil(seconds * 1000) + MARGIN_MS
end

-- The store's birth: created (learning for one maximum lease) when the state was lost.
local function epoch(key, now, max_lease)
  local e = redis.call('HMGET', key, 'born', 'until')
  if not e[1] then
    redis.call('HSET', key, 'born', now, 'until', now + max_lease)
    return now, now + max_lease
  end
  return tonumber(e[1]), tonumber(e[2])
end

-- Parsed definitions stay in the library's Lua state between calls: a bucket blob's fields
-- and a spec set's table are pure functions of their bytes (spec keys are digests of their
-- content), and parsing them with cmsgpack on every call cost ~25 µs of a ~130 µs call. A
-- call gets a fresh table whose reads fall through to the cached fields (a metatable), so what
-- it sets (amount, side, ...) stays its own. Each cache starts afresh past CACHE_MAX entries;
-- a reloaded library or a restarted Redis starts empty.
local CACHE_MAX = 4096
local blob_cache, blob_count = {}, 0

local function part_meta(blob, extra)
  local t = cmsgpack.unpack(blob)
  local base = {name = t[1], rule = t[2], dim = t[3], cap = t[4], period = t[5],
                x1 = t[6], x2 = t[7], x3 = t[8], x4 = t[9], shadow = t[10] == 1,
                cached_free = t[11] == 1}
  if extra then
    for k, v in pairs(extra) do base[k] = v end
  end
  return {__index = base}
end

-- own: the call's own fields (one table constructor, not fields added one by one).
local function read_part(blob, own)
  local meta = blob_cache[blob]
  if not meta then
    if blob_count >= CACHE_MAX then blob_cache, blob_count = {}, 0 end
    meta = part_meta(blob)
    blob_cache[blob] = meta
    blob_count = blob_count + 1
  end
  return setmetatable(own or {}, meta)
end

-- A request's buckets are registered once (quotas/store/redis.py, RedisReservationStore.specs):
-- a string at their spec key, msgpack {n, lane, record key prefix, qp, retention (s), max
-- lease (s), expiry limit, (blob, key, hkey, pkey, side)*n} (the lease record is <record key
-- prefix><reservation id>; qp the pool's queue prefix, '' when not queued; the last three the
-- store's settings, which every script needs), named by a
-- digest of itself, so a call sends the key and its amounts, not the definitions. def: that
-- definition when the caller does not know Redis has it ('' when it does). Returns nil when
-- the key is missing (Redis restarted or flushed): the script answers {'S'} having changed
-- nothing, and the caller sends the definition again. A week's TTL: sets no longer used go.
-- A set parsed before (spec_cache) is used as it is once EXISTS says Redis still has the key,
-- so a lost key is still answered with {'S'} and registered again.
local SPEC_MS = 7 * 86400000
local spec_cache, spec_count = {}, 0

local function spec_keep(skey, t)
  if spec_count >= CACHE_MAX then spec_cache, spec_count = {}, 0 end
  t.metas = {}  -- per part, its fields (spec_part)
  spec_cache[skey] = t
  spec_count = spec_count + 1
  return t
end

local function specs_load(skey, def)
  local t = spec_cache[skey]
  if def ~= '' then
    redis.call('SET', skey, def, 'PX', SPEC_MS)
    return t or spec_keep(skey, cmsgpack.unpack(def))
  end
  if t then
    if redis.call('EXISTS', skey) == 1 then return t end
    return nil
  end
  local raw = redis.call('GET', skey)
  if not raw then return nil end
  return spec_keep(skey, cmsgpack.unpack(raw))
end

local function spec_meta(t, i)
  local meta = t.metas[i]
  if not meta then
    local at = 8 + 5 * (i - 1)
    meta = part_meta(t[at], {blob = t[at], key = t[at + 1], hkey = t[at + 2],
                             pkey = t[at + 3], sidev = t[at + 4], side = t[at + 4] == 1,
                             own = t[at + 4] == 2})
    t.metas[i] = meta
  end
  return meta
end

-- Part i of a spec set: read_part's fields with .blob, .key, .hkey, .pkey and .sidev (the
-- side, 0 shared, 1 pool, 2 own) set, and .side / .own as the fair queue's parts have them
-- (queue_lib.lua q_parts).
local function spec_part(t, i)
  return setmetatable({}, spec_meta(t, i))
end

-- The parts of a spec set by name, their fields shared with every call: for a caller that
-- only reads them (settle).
local function spec_by_name(t)
  local by_name = t.by_name
  if not by_name then
    by_name = {}
    for i = 1, t[1] do
      local p = spec_meta(t, i).__index
      by_name[p.name] = p
    end
    t.by_name = by_name
  end
  return by_name
end

local function window_of(p, now)
  local b0, b1, b2, b3 = p.x1, p.x2, p.x3, p.x4
  if now < b1 then
    if now >= b0 then return b0, b1 end
    return b0 - (b1 - b0), b0
  end
  if now < b2 then return b1, b2 end
  if now < b3 then return b2, b3 end
  return b3, b3 + (b3 - b2)
end

local function slice_field(k)
  return 's' .. string.format('%d', k)
end

local function num(x)
  if x then return tonumber(x) end
  return nil
end

-- A packed bucket's three doubles (the file's head: refill level, ts, exp; fixed window
-- wstart, wend, used; ramp cur, cur_used, prev_used), or nil when it has no state. When the
-- packed key is missing, the hash of the layout before (same name with ':b:', written by a
-- gateway of the previous version during a deploy) is read instead; its fourth value, fresh,
-- is then true: the packed key has no TTL yet, so its first write must set one.
local PACK3 = '<ddd'
local LEGACY_FIELDS = {refill = {'level', 'ts', 'exp'},
                       fixed_window = {'wstart', 'wend', 'used'},
                       ramp = {'cur', 'cur_used', 'prev_used'}}

local PACKED = {refill = true, fixed_window = true, ramp = true, rolling_window = true}
local PACK4, SLICE = '<dddd', '<d'  -- a rolling window's 'p' and one slice's sum

-- A packed bucket's key in the hash layout (':b:' for ':bp:', quotas/core/keys.py), and back.
local function hash_layout_key(p, key)
  return string.sub(key, 1, #key - #p.name - 4) .. ':b:' .. p.name
end

local function packed_layout_key(p, key)
  return string.sub(key, 1, #key - #p.name - 3) .. ':bp:' .. p.name
end

local function packed_legacy(p, key)
  local old = hash_layout_key(p, key)
  local f = LEGACY_FIELDS[p.rule]
  local h = redis.call('HMGET', old, f[1], f[2], f[3])
  if not h[1] then return nil end
  return tonumber(h[1]), num(h[2]), num(h[3]), true
end

-- A rolling window's hash of the layout before (total, lo, hi, exp, s<k> as numbers), if
-- there is one, copied into key as this layout's (same TTL); true if there was one.
local function rolling_legacy(p, key)
  local old = hash_layout_key(p, key)
  local raw = redis.call('HGETALL', old)
  local t = {}
  for i = 1, #raw, 2 do t[raw[i]] = raw[i + 1] end
  if not t.total then return false end
  local args = {'HSET', key, 'p', struct.pack(PACK4, tonumber(t.total), tonumber(t.lo),
                                              tonumber(t.hi), tonumber(t.exp or '0'))}
  for name, value in pairs(t) do
    if string.sub(name, 1, 1) == 's' then
      args[#args + 1] = name
      args[#args + 1] = struct.pack(SLICE, tonumber(value))
    end
  end
  redis.call(unpack(args))
  local ttl = redis.call('PTTL', old)
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
  return true
end

-- A slice's sum as HGET / HMGET gave it (false or nil: 0).
local function slice_value(raw)
  if raw then return (struct.unpack(SLICE, raw)) end
  return 0
end

local function packed_read(p, key)
  local state = redis.call('GET', key)
  if not state then return packed_legacy(p, key) end
  local a, b, c = struct.unpack(PACK3, state)
  return a, b, c, false
end

-- A concurrency hash's nx when no holder is left (hold() lowers it to the next expiry).
local NO_HOLDER = 1e300

-- view: bring a bucket to now. Returns {exists, avail, a, b, c, ...} like core View.
-- extra: one more hash field the caller will read (settle: its own holder 'h:<id>', or its
-- marker's rolling slice), read in the same HMGET: v.extra (false when missing). Each rule
-- reads its state with one command (a packed bucket a GET, the others an HMGET); a rolling
-- window reads now's slice with it (v.cur).
local function view(p, key, hkey, now, born, limit, extra)
  if p.rule == 'refill' then
    local level, ts, exp, fresh = packed_read(p, key)
    if fresh then exp = nil end  -- the packed key has no TTL yet
    if not level then
      level = math.min(p.cap, (now - born) * p.cap / p.period)
      return {exists = false, avail = level, a = level}
    end
    if now > ts then
      level = math.min(p.cap, level + (now - ts) * p.cap / p.period)
    end
    return {exists = true, ts = ts, exp = exp, avail = level, a = level}
  elseif p.rule == 'fixed_window' then
    local start, stop = window_of(p, now)
    local wstart, _, wused, fresh = packed_read(p, key)
    local used, same = 0, false
    if wstart == start then
      used, same = wused, true
    end
    -- fresh: read from the layout before; the packed key gets its TTL when written
    return {exists = wstart ~= nil, same = same and not fresh, avail = p.cap - used, a = start,
            b = stop, c = used}
  elseif p.rule == 'rolling_window' then
    local width = p.period / p.x1
    local k_now = math.floor(now / width)
    local k_min = math.floor((now - p.period) / width)
    local h = redis.call('HMGET', key, 'p', slice_field(k_now), extra or 'p')
    if not h[1] and rolling_legacy(p, key) then
      h = redis.call('HMGET', key, 'p', slice_field(k_now), extra or 'p')
    end
    local total, lo, hi, exp
    if h[1] then total, lo, hi, exp = struct.unpack(PACK4, h[1]) end
    if h[1] and k_min > hi then
      redis.call('DEL', key)
      h = {false}
    end
    if not h[1] then
      return {exists = false, avail = p.cap, a = k_now, total = 0, cur = false, extra = false}
    end
    if lo < k_min then
      local last = math.min(k_min - 1, lo + p.x1 + 2)
      local k = lo
      while k <= last do
        local f = slice_field(k)
        local v = redis.call('HGET', key, f)
        if v then
          total = total - slice_value(v)
          redis.call('HDEL', key, f)
        end
        k = k + 1
      end
      lo = k_min
      redis.call('HSET', key, 'p', struct.pack(PACK4, total, lo, hi, exp))
    end
    return {exists = true, exp = exp, avail = p.cap - total, a = k_now, total = total,
            lo = lo, hi = hi, cur = h[2], extra = extra and h[3]}
  elseif p.rule == 'concurrency' then
    local h = redis.call('HMGET', key, 'held', 'exp', 'lc', 'lt', 'lg', 'nx', extra or 'nx')
    if not h[1] then
      return {exists = false, avail = p.cap, held = 0, cap = p.cap, extra = false}
    end
    local held = tonumber(h[1])
    -- A learned limit (period > 0): lc as of lt, growing one per period while lg (it was full).
    local cap, learned = p.cap, h[3] ~= false
    if learned then
      cap = tonumber(h[3])
      if h[5] == '1' then cap = math.min(p.cap, cap + (now - tonumber(h[4])) / p.period) end
    end
    local nx, mine = num(h[6]), extra and h[7]
    -- No holder's lease can have run out before nx: the sweep is skipped (nil: not known).
    if not nx or nx <= now then
      local due = redis.call('ZRANGEBYSCORE', hkey, '-inf', now, 'LIMIT', 0, limit)
      for _, id in ipairs(due) do
        local f = 'h:' .. id
        local amount = tonumber(redis.call('HGET', key, f))
        redis.call('HDEL', key, f)
        redis.call('ZREM', hkey, id)
        held = held - amount
        if f == extra then mine = false end
      end
      if #due < limit then  -- every due holder is gone: nx is the earliest expiry left
        local first = redis.call('ZRANGE', hkey, 0, 0, 'WITHSCORES')
        nx = tonumber(first[2] or NO_HOLDER)
        redis.call('HSET', key, 'held', held, 'nx', nx)
      elseif #due > 0 then
        redis.call('HSET', key, 'held', held)
      end
    end
    return {exists = true, exp = num(h[2]), avail = cap - held, held = held, cap = cap,
            learned = learned, nx = nx, extra = mine}
  end
  -- ramp
  local idx = math.floor(now / p.period)
  local cur, hc, hp, fresh = packed_read(p, key)
  local cu, pu, same = 0, 0, false
  if cur then
    if idx == cur then
      cu, pu, same = hc, hp, true
    elseif idx == cur + 1 then
      cu, pu = 0, hc
    elseif idx > cur + 1 then
      cu, pu = 0, 0
    else
      idx, cu, pu, same = cur, hc, hp, true
    end
  end
  local allowance = math.max(p.cap, p.x1 * pu)
  return {exists = cur ~= nil, same = same and not fresh, avail = allowance - cu, a = idx,
          b = cu, c = pu}
end

-- fit_time: earliest time amount fits with no other traffic (now if it fits, INF if never).
local function fit_time(p, v, key, hkey, now, amount)
  if amount <= v.avail then return now end
  if p.rule == 'refill' then
    -- One tick later than exact, so that at retry_at it fits despite float rounding.
    return now + (amount - v.avail) * p.period / p.cap + TICK
  elseif p.rule == 'fixed_window' then
    return v.b
  elseif p.rule == 'rolling_window' then
    if not v.exists then return now end
    local width = p.period / p.x1
    local need = amount - v.avail
    local freed = 0
    local k = v.lo
    while k <= v.hi do
      freed = freed + slice_value(redis.call('HGET', key, slice_field(k)))
      if freed >= need then return (k + 1) * width + p.period end
      k = k + 1
    end
    return (v.hi + 1) * width + p.period
  elseif p.rule == 'concurrency' then
    if not v.exists then return now end
    local need = amount - v.avail
    local freed = 0
    local rows = redis.call('ZRANGE', hkey, 0, HOLDER_SCAN - 1, 'WITHSCORES')
    for i = 1, #rows, 2 do
      freed = freed + tonumber(redis.call('HGET', key, 'h:' .. rows[i]))
      if freed >= need then return math.max(now, tonumber(rows[i + 1])) end
    end
    return INF
  end
  local next_allowance = math.max(p.cap, p.x1 * v.b)
  if amount <= next_allowance then return (v.a + 1) * p.period end
  return INF
end

-- Writes. Each keeps the key alive at least as long as its state still matters; the TTL is
-- extended (with slack) only when the recorded 'exp' falls short, to save a call per write.
local function rolling_add(p, v, key, k, amount, now)
  local f = slice_field(k)
  local need = now + p.period + p.period / p.x1
  if not v.exists then
    local e = need + p.period / 4
    redis.call('HSET', key, 'p', struct.pack(PACK4, amount, k, k, e), f,
      struct.pack(SLICE, amount))
    redis.call('PEXPIRE', key, ttl_ms(e - now))
    return
  end
  local have = slice_value(v.cur)  -- k is now's slice, read by view
  local e, longer = v.exp, v.exp < need  -- exp 0: not known (copied from the layout before)
  if longer then e = need + p.period / 4 end
  redis.call('HSET', key, f, struct.pack(SLICE, have + amount), 'p',
    struct.pack(PACK4, v.total + amount, math.min(v.lo, k), math.max(v.hi, k), e))
  if longer then redis.call('PEXPIRE', key, ttl_ms(e - now)) end
end

local function write_refill(p, v, key, now, level)
  local ts = now
  if v.exists and v.ts > now then ts = v.ts end
  -- Expiring is harmless once the bucket would be full again (and past born + period).
  local need = now + (p.cap - level) * p.period / p.cap + p.period
  if v.exp and v.exp >= need then
    redis.call('SET', key, struct.pack(PACK3, level, ts, v.exp), 'KEEPTTL')
  else
    local e = need + p.period
    redis.call('SET', key, struct.pack(PACK3, level, ts, e), 'PX', ttl_ms(e - now))
  end
end

local function write_window(key, v, now, used)
  local state = struct.pack(PACK3, v.a, v.b, used)
  if v.same then
    redis.call('SET', key, state, 'KEEPTTL')
  else
    redis.call('SET', key, state, 'PX', ttl_ms(v.b - now))
  end
end

local function write_ramp(p, key, v, cu, pu)
  local state = struct.pack(PACK3, v.a, cu, pu)
  if v.same then
    redis.call('SET', key, state, 'KEEPTTL')
  else
    redis.call('SET', key, state, 'PX', ttl_ms(2 * p.period))
  end
end

-- Hold a concurrency slot for id until expiry (exp: the hash's recorded 'exp', or nil; nx:
-- its 'nx', lowered to expiry if later or nil, so the sweep in view runs by then).
local function hold(key, hkey, exp, nx, held, id, amount, expiry, now)
  local args = {'HSET', key, 'held', held, 'h:' .. id, amount}
  if not nx or nx > expiry then
    args[#args + 1] = 'nx'
    args[#args + 1] = expiry
  end
  if exp and exp >= expiry then
    redis.call(unpack(args))
    redis.call('ZADD', hkey, expiry, id)
  else
    local e = expiry + (expiry - now)
    args[#args + 1] = 'exp'
    args[#args + 1] = e
    redis.call(unpack(args))
    redis.call('ZADD', hkey, expiry, id)
    redis.call('PEXPIRE', key, ttl_ms(e - now))
    redis.call('PEXPIRE', hkey, ttl_ms(e - now))
  end
end

-- A learned limit keeps its growth so far when what it holds changes, and grows from now on
-- only if it is then full (core buckets._learned_hold).
local function learned_hold(key, v, held, now)
  local lg = '0'
  if held + 1 > v.cap then lg = '1' end
  redis.call('HSET', key, 'lc', v.cap, 'lt', now, 'lg', lg)
end

-- take: the caller checked that amount fits. Returns the marker (window/slice/interval).
local function take(p, v, key, hkey, now, amount, id, expiry)
  if p.rule == 'refill' then
    write_refill(p, v, key, now, v.a - amount)
    return 0
  elseif p.rule == 'fixed_window' then
    write_window(key, v, now, v.c + amount)
    return v.a
  elseif p.rule == 'rolling_window' then
    rolling_add(p, v, key, v.a, amount, now)
    return v.a
  elseif p.rule == 'concurrency' then
    hold(key, hkey, v.exp, v.nx, v.held + amount, id, amount, expiry, now)
    if v.learned then learned_hold(key, v, v.held + amount, now) end
    return 0
  end
  write_ramp(p, key, v, v.b + amount, v.c)
  return v.a
end

-- Returns what is held afterwards, or nil if id held nothing. amount: its 'h:<id>' as view
-- read it (false: none), or nil to read it here.
local function release_holder(key, hkey, id, held, amount)
  local f = 'h:' .. id
  if amount == nil then amount = redis.call('HGET', key, f) end
  if not amount then return nil end
  if held == nil then held = tonumber(redis.call('HGET', key, 'held')) end
  redis.call('HDEL', key, f)
  redis.call('ZREM', hkey, id)
  held = held - tonumber(amount)
  redis.call('HSET', key, 'held', held)
  return held
end

-- The field settle() reads beside the bucket's state (view's extra): the reservation's holder,
-- or its marker's rolling slice.
local function settle_field(p, marker, id)
  if p.rule == 'concurrency' then return 'h:' .. id end
  if p.rule == 'rolling_window' then
    if marker >= 0 then return slice_field(marker) end
    return slice_field(-1)
  end
  return nil
end

-- settle: replace taken by actual (give back to a still-current window, charge overage).
local function settle(p, v, key, hkey, now, taken, actual, marker, id)
  local diff = actual - taken
  if p.rule == 'refill' then
    write_refill(p, v, key, now, math.min(p.cap, v.a - diff))
  elseif p.rule == 'fixed_window' then
    if marker == v.a then
      write_window(key, v, now, math.max(0, v.c + diff))
    elseif diff > 0 then
      write_window(key, v, now, v.c + diff)
    end
  elseif p.rule == 'rolling_window' then
    if diff > 0 then
      rolling_add(p, v, key, v.a, diff, now)
    elseif v.exists and diff < 0 then
      local k = -1
      if marker >= 0 then k = marker end
      local f = slice_field(k)
      local have = v.extra  -- the marker's slice, read by view (settle_field)
      if have == nil then have = redis.call('HGET', key, f) end
      if k >= v.lo and have then
        have = slice_value(have)
        local back = math.min(have, -diff)
        redis.call('HSET', key, f, struct.pack(SLICE, have - back), 'p',
          struct.pack(PACK4, v.total - back, v.lo, v.hi, v.exp))
      end
    end
  elseif p.rule == 'concurrency' then
    if v.exists then
      local held = release_holder(key, hkey, id, v.held, v.extra)
      if held and v.learned then learned_hold(key, v, held, now) end
    end
  else
    if marker == v.a then
      write_ramp(p, key, v, math.max(0, v.b + diff), v.c)
    elseif marker == v.a - 1 then
      write_ramp(p, key, v, v.b, math.max(0, v.c + diff))
    elseif diff > 0 then
      write_ramp(p, key, v, v.b + diff, v.c)
    end
  end
end

local LEARNING_RULES = {fixed_window = true, rolling_window = true, concurrency = true}

-- reserve_parts: all or nothing over parts (in D1 order). ctx = {now, born, learning_until,
-- limit, id, expiry}; parts[i] = read_part(...) with .amount, .key, .hkey, .pkey set. Returns
-- {ok = true, taken = {{amount, marker, skipped, remaining after}...}, shadow = {...}} or
-- {ok = false, bucket, reason, retry, live = {...}, shadow = {...}}; refusals are
-- {name, reason, retry}. Writes only when granting (and lazy expiry/pruning in view).
local function reserve_parts(ctx, parts)
  local now = ctx.now
  local learning = now < ctx.learning_until
  -- one MGET of the scopes' pause keys, each once (a request's parts share few scopes)
  local pkeys, slot, at = {}, {}, {}
  for i, p in ipairs(parts) do
    if not slot[p.pkey] then
      pkeys[#pkeys + 1] = p.pkey
      slot[p.pkey] = #pkeys
    end
    at[i] = slot[p.pkey]
  end
  local pauses = redis.call('MGET', unpack(pkeys))
  local reasons, retries, views = {}, {}, {}  -- per part (no table per part)
  for i, p in ipairs(parts) do
    local reason, retry, v = false, now, false
    local paused = pauses[at[i]]  -- a pause end, or false (mostly: nothing to parse)
    if paused then
      paused = tonumber(paused)
      if paused <= now then paused = 0 end
    else
      paused = 0
    end
    if p.rule ~= 'ramp' and p.amount > p.cap then
      reason, retry = 'unsatisfiable', INF
    elseif paused > now then
      reason, retry = 'paused', paused
    elseif learning and LEARNING_RULES[p.rule] then
      reason, retry = 'recovering', ctx.learning_until
    else
      v = view(p, p.key, p.hkey, now, ctx.born, ctx.limit)
      if p.amount > v.avail then
        if p.rule == 'ramp' then reason = 'ramp_limited' else reason = 'bucket_exhausted' end
        retry = fit_time(p, v, p.key, p.hkey, now, p.amount)
      end
    end
    reasons[i], retries[i] = reason, retry
    views[i] = v
  end
  local live, shadow, unsat = {}, {}, false
  for i, p in ipairs(parts) do
    local reason, retry = reasons[i], retries[i]
    if reason then
      local row = {p.name, reason, retry}
      if p.shadow then
        shadow[#shadow + 1] = row
      else
        live[#live + 1] = row
        if reason == 'unsatisfiable' and not unsat then unsat = row end
      end
    end
  end
  if #live > 0 then
    local first, retry = unsat or live[1], INF
    if not unsat then
      retry = live[1][3]
      for _, row in ipairs(live) do retry = math.max(retry, row[3]) end
    end
    return {ok = false, bucket = first[1], reason = first[2], retry = retry,
            live = live, shadow = shadow}
  end
  local taken = {}
  for i, p in ipairs(parts) do
    if reasons[i] or not views[i] then
      local left = 0
      if views[i] then left = views[i].avail end
      taken[i] = {0, 0, 1, left}
    else
      local left = views[i].avail - p.amount
      local marker = take(p, views[i], p.key, p.hkey, now, p.amount, ctx.id, ctx.expiry)
      taken[i] = {p.amount, marker, 0, left}
    end
  end
  return {ok = true, taken = taken, shadow = shadow}
end

-- A lease record: one string (struct.pack), written once when granted and read once when
-- settled; settling and expiring change only its first byte (the state), so its TTL stays the
-- one written with it (expiry + retention). Renew and extend write it again.
--   header  c1 state (REC_CODE), d created, d expires, B n, s reservation id
--   n rows  d amount, d marker, B skipped (0/1), d locked (extend.lua; 0 when none),
--           s bucket name, s held key: the bucket hash of a concurrency slot the lease holds
--           ('' when none; its holders zset is <key>:h, quotas/core/keys.py holders_key)
-- Names and held keys make the record enough for settle, replay and reap without the bucket
-- definitions; numbers as doubles need no formatting either way. In memory it is the flat
-- array struct.unpack gives (rec_row: where row i starts). A msgpack record of the version
-- before (a table {id, created, expires, state, rows, holds}) still loads (record_legacy).
local REC_STATE = {a = 'active', r = 'reconciled', l = 'released', e = 'expired'}
local REC_CODE = {active = 'a', reconciled = 'r', released = 'l', expired = 'e'}
local REC_HEAD, REC_ROW = 5, 6
local rec_formats = {}

local function rec_format(n)
  local f = rec_formats[n]
  if not f then
    f = '<c1ddBs' .. string.rep('ddBdss', n)
    rec_formats[n] = f
  end
  return f
end

-- Row i's first field is rec[rec_row(i) + 1] (amount; + 2 marker, + 3 skipped, + 4 locked,
-- + 5 name, + 6 held key).
local function rec_row(i)
  return REC_HEAD + REC_ROW * (i - 1)
end

local function rec_state(rec)
  return REC_STATE[rec[1]]
end

local function record_new(id, created, expires, parts, taken)
  local rec = {'a', created, expires, #parts, id}
  local at = REC_HEAD
  for i, p in ipairs(parts) do
    local t = taken[i]
    local held = ''
    if p.rule == 'concurrency' and t[3] == 0 then held = p.key end
    rec[at + 1], rec[at + 2], rec[at + 3], rec[at + 4], rec[at + 5], rec[at + 6] =
      t[1], t[2], t[3], 0, p.name, held
    at = at + REC_ROW
  end
  return rec
end

local function record_pack(rec)
  local n = rec[4]
  return struct.pack(rec_format(n), unpack(rec, 1, REC_HEAD + REC_ROW * n))
end

local function record_write(rkey, rec, now, retention)
  redis.call('SET', rkey, record_pack(rec), 'PX', ttl_ms(rec[3] + retention - now))
end

-- A new state, written in place (SETRANGE keeps the key's TTL).
local function record_mark(rkey, rec, state)
  rec[1] = REC_CODE[state]
  redis.call('SETRANGE', rkey, 0, rec[1])
end

-- The previous version's msgpack record as this version's array: each hold goes to the row
-- of its bucket (a bucket key ends with ':b:<name>'). record_load writes it back in this
-- version's format (same TTL), so that record_mark can change its first byte.
local function record_legacy(blob)
  local r = cmsgpack.unpack(blob)
  local rows, holds = r[5], r[6]
  local rec = {REC_CODE[r[4]], r[2], r[3], #rows, r[1]}
  local at = REC_HEAD
  for _, row in ipairs(rows) do
    local held, tail = '', ':b:' .. row[1]
    for _, h in ipairs(holds) do
      if string.sub(h[1], -#tail) == tail then held = h[1] end
    end
    rec[at + 1], rec[at + 2], rec[at + 3], rec[at + 4], rec[at + 5], rec[at + 6] =
      row[2], row[3], row[4], row[5] or 0, row[1], held
    at = at + REC_ROW
  end
  return rec
end

-- The record if it is still retained (the TTL may lag an explicit test clock).
local function record_load(rkey, now, retention)
  local blob = redis.call('GET', rkey)
  if not blob then return nil end
  local rec
  if string.byte(blob, 1) == 0x96 then  -- a msgpack array of 6: the version before
    rec = record_legacy(blob)
    redis.call('SET', rkey, record_pack(rec), 'KEEPTTL')
  else
    rec = {struct.unpack(rec_format(string.byte(blob, 18)), blob)}
  end
  if now >= rec[3] + retention then
    redis.call('DEL', rkey)
    return nil
  end
  return rec
end

-- reserve.lua's replay reply: {'P', now, created, expires, state, n, (name, amount, marker,
-- skipped)*n}.
local function record_replay(rec, now)
  local state = rec_state(rec)
  if state == 'active' and rec[3] <= now then state = 'expired' end
  local out = {'P', fmt(now), fmt(rec[2]), fmt(rec[3]), state, rec[4]}
  for i = 1, rec[4] do
    local at = rec_row(i)
    out[#out + 1] = rec[at + 5]
    out[#out + 1] = fmt(rec[at + 1])
    out[#out + 1] = fmt(rec[at + 2])
    out[#out + 1] = tostring(rec[at + 3])
  end
  return out
end

-- Its concurrency slots held again until expires (renew.lua; adopt: held anew if missing).
local function record_holds(rec, each)
  for i = 1, rec[4] do
    local at = rec_row(i)
    local key = rec[at + 6]
    if key ~= '' then each(key, key .. ':h', rec[at + 1]) end
  end
end

-- Expire a lease: its concurrency holds go back; other estimates stand (maybe dispatched).
local function record_expire(rkey, rec, index, now, retention)
  local id = rec[5]
  record_holds(rec, function(key, hkey)
    if redis.call('HGET', key, 'held') then release_holder(key, hkey, id, nil) end
  end)
  record_mark(rkey, rec, 'expired')
  redis.call('ZREM', index, rkey)
end
