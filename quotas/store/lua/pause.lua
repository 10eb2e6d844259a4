-- pause: refuse reservations touching a scope until ARGV[3] (provider 429 + Retry-After, F2).
-- KEYS[1] epoch hash, KEYS[2] the scope's pause key (string: pause end, epoch s).
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] max lease (s), ARGV[3] pause end (epoch s).
-- A pause only ever extends; each pause set or extended counts in the epoch's 'pauses' (read by
-- every process's heartbeat: its allowances grant nothing more once it moved).
-- Returns the pause end in force (%.17g; '0' if none).
local now = clock(ARGV[1])
epoch(KEYS[1], now, tonumber(ARGV[2]))
local untl = tonumber(ARGV[3])
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current <= now then current = 0 end
if untl > current and untl > now then
  redis.call('SET', KEYS[2], untl, 'PX', math.ceil((untl - now) * 1000))
  redis.call('HINCRBY', KEYS[1], 'pauses', 1)
  return fmt(untl)
end
return fmt(current)
