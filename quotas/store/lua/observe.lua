-- observe: lower a bucket to what a provider's headers report (SPEC C12); never raises it.
-- A learned concurrency limit is lowered by a provider 429 that no known limit explains.
-- KEYS[1] epoch hash, KEYS[2] bucket hash, KEYS[3] holders zset.
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] max lease (s), ARGV[3] expiry limit,
-- ARGV[4] the bucket blob (lib.lua read_part), ARGV[5] remaining (bucket units),
-- ARGV[6] reset (epoch s when the provider says it is full again; 0 if unknown).
-- Returns the available amount after the observation (%.17g).
local now = clock(ARGV[1])
local born = epoch(KEYS[1], now, tonumber(ARGV[2]))
local limit = tonumber(ARGV[3])
local p = read_part(ARGV[4])
local key, hkey = KEYS[2], KEYS[3]
local remaining, reset_at = tonumber(ARGV[5]), tonumber(ARGV[6])
local v = view(p, key, hkey, now, born, limit)
if p.rule == 'refill' then
  local target = remaining
  if reset_at > now then
    target = math.min(target, p.cap - (reset_at - now) * p.cap / p.period)
  end
  if target < v.a then write_refill(p, v, key, now, target) end
elseif p.rule == 'fixed_window' then
  local floor_used = p.cap - remaining
  if floor_used > v.c then write_window(key, v, now, floor_used) end
elseif p.rule == 'rolling_window' then
  if remaining < v.avail then rolling_add(p, v, key, v.a, v.avail - remaining, now) end
elseif p.rule == 'concurrency' and p.period > 0 and v.exists then
  -- A learned limit: cut to x1 (the factor) x what was in flight, if the refusal came within
  -- it. The key (and its holders) then live at least as long as growing back to the ceiling
  -- would take, so a quiet spell does not forget what was learned.
  local seen = v.held + remaining
  if seen >= 1 and seen < v.cap then
    local learned = math.max(1, p.x1 * seen)
    local horizon = math.max(v.exp or now, now + (p.cap - learned) * p.period)
    local lg = '0'
    if v.held + 1 > learned then lg = '1' end
    redis.call('HSET', key, 'lc', learned, 'lt', now, 'lg', lg, 'exp', horizon)
    redis.call('PEXPIRE', key, ttl_ms(horizon - now))
    redis.call('PEXPIRE', hkey, ttl_ms(horizon - now))
  end
end
return fmt(view(p, key, hkey, now, born, limit).avail)
