-- recovery: look at the epoch (created learning if missing, as by every script) and, while it
-- is learning, record a member's report: it holds no reservation of the lost state that is
-- not re-registered here (quotas/core/recovery.py). KEYS[1] epoch hash.
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] max lease (s), ARGV[3] the reporting
-- member's id ('' = only look), ARGV[4] the epoch's born it re-registered in ('' = any: it held
-- nothing); another epoch gets no report from it.
-- Returns {now, born, until, pauses, k, reported member ids...} (the ids only while learning;
-- pauses: how many pauses were set in this epoch, see pause.lua).
local now = clock(ARGV[1])
local born, learning_until = epoch(KEYS[1], now, tonumber(ARGV[2]))
local pauses = redis.call('HGET', KEYS[1], 'pauses') or '0'
local out = {fmt(now), fmt(born), fmt(learning_until), pauses, 0}
if now >= learning_until then return out end
if ARGV[3] ~= '' and (ARGV[4] == '' or tonumber(ARGV[4]) == born) then
  redis.call('HSET', KEYS[1], 'r:' .. ARGV[3], fmt(now))
end
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 2) == 'r:' then
    out[5] = out[5] + 1
    out[#out + 1] = string.sub(field, 3)
  end
end
return out
