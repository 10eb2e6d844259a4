-- renew: extend a live lease (streams, long requests), or adopt one lost with the store's
-- state (SPEC C9, C10). KEYS[1] epoch hash, KEYS[2] lease record, KEYS[3] lease index,
-- KEYS[4] the grant parts' spec key (lib.lua specs_load), read only to adopt.
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] reservation id, ARGV[3] lease (s),
-- ARGV[4] retention (s), ARGV[5] max lease (s), ARGV[6] the grant's created time,
-- ARGV[7] the spec set's definition or '', then per part i: ARGV[5 + 3i] amount taken,
-- ARGV[6 + 3i] marker, ARGV[7 + 3i] skipped (0/1).
-- Returns {outcome, expires}: renewed | adopted | expired | closed | unknown; {'S'} when it
-- would adopt and the spec key is unknown (nothing done): the caller sends the definition.
local now = clock(ARGV[1])
local id, lease, retention = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local born = epoch(KEYS[1], now, tonumber(ARGV[5]))
local created = tonumber(ARGV[6])
local expires = now + lease

local function rehold(key, hkey, amount, adopt)
  local h = redis.call('HMGET', key, 'held', 'exp', 'h:' .. id, 'nx')
  local held = tonumber(h[1] or '0')
  if not h[3] then
    if not adopt then return end
    held = held + amount
  end
  hold(key, hkey, num(h[2]), num(h[4]), held, id, amount, expires, now)
end

local rec = record_load(KEYS[2], now, retention)
if not rec then
  if born <= created then return {'unknown', '0'} end
  -- Lost in a restart while in flight: hold its concurrency again, no capacity check.
  local specs = specs_load(KEYS[4], ARGV[7])
  if not specs then return {'S'} end
  local parts, taken = {}, {}
  for i = 1, specs[1] do
    local at = 5 + 3 * i
    local p = spec_part(specs, i)
    local amount, marker, skipped = tonumber(ARGV[at]), tonumber(ARGV[at + 1]),
      tonumber(ARGV[at + 2])
    if p.rule == 'concurrency' and skipped == 0 then rehold(p.key, p.hkey, amount, true) end
    parts[i] = p
    taken[i] = {amount, marker, skipped}
  end
  rec = record_new(id, created, expires, parts, taken)
  record_write(KEYS[2], rec, now, retention)
  redis.call('ZADD', KEYS[3], expires, KEYS[2])
  return {'adopted', fmt(expires)}
end
if rec[1] ~= 'a' then return {'closed', fmt(rec[3])} end
if rec[3] <= now then
  record_expire(KEYS[2], rec, KEYS[3], now, retention)
  return {'expired', fmt(rec[3])}
end
rec[3] = expires
record_holds(rec, function(key, hkey, amount) rehold(key, hkey, amount, false) end)
record_write(KEYS[2], rec, now, retention)
redis.call('ZADD', KEYS[3], expires, KEYS[2])
return {'renewed', fmt(expires)}
