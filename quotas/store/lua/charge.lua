-- charge: add usage that bypassed reservation (e.g. replaying the ledger after lost state).
-- KEYS[1] epoch hash; per part i: KEYS[2i] bucket hash, KEYS[2i+1] holders zset.
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] max lease (s), ARGV[3] expiry limit,
-- ARGV[4] n, then per part: the bucket blob (lib.lua read_part) and the amount to charge.
-- Returns now (%.17g).
local now = clock(ARGV[1])
local born = epoch(KEYS[1], now, tonumber(ARGV[2]))
local limit = tonumber(ARGV[3])
for i = 1, tonumber(ARGV[4]) do
  local p = read_part(ARGV[3 + 2 * i])
  local key, hkey = KEYS[2 * i], KEYS[2 * i + 1]
  local v = view(p, key, hkey, now, born, limit)
  settle(p, v, key, hkey, now, 0, tonumber(ARGV[4 + 2 * i]), -1, '')
end
return fmt(now)
