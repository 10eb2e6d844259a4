-- levels: what each bucket has available now and when it is full again (SPEC H1 metadata).
-- KEYS[1] epoch hash; per part i: KEYS[3i-1] bucket hash, KEYS[3i] holders zset,
-- KEYS[3i+1] the scope's pause key. ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] max
-- lease (s), ARGV[3] expiry limit, ARGV[4] n, then per part the bucket blob (lib.lua).
-- Returns {now, (available, full_at, paused_until, capacity)*n} as %.17g strings; capacity is
-- the configured one, or a learned concurrency limit's current value.
local now = clock(ARGV[1])
local born = epoch(KEYS[1], now, tonumber(ARGV[2]))
local limit = tonumber(ARGV[3])
local out = {fmt(now)}
for i = 1, tonumber(ARGV[4]) do
  local p = read_part(ARGV[4 + i])
  local key, hkey = KEYS[3 * i - 1], KEYS[3 * i]
  local v = view(p, key, hkey, now, born, limit)
  local full_at
  if p.rule == 'ramp' then
    if v.b == 0 then full_at = now else full_at = (v.a + 1) * p.period end
  else
    full_at = fit_time(p, v, key, hkey, now, v.cap or p.cap)
  end
  local paused = tonumber(redis.call('GET', KEYS[3 * i + 1]) or '0')
  if paused <= now then paused = 0 end
  out[#out + 1] = fmt(v.avail)
  out[#out + 1] = fmt(full_at)
  out[#out + 1] = fmt(paused)
  out[#out + 1] = fmt(v.cap or p.cap)
end
return out
