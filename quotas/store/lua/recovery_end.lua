-- recovery_end: end (or bring forward) the learning period of the epoch a recovery decided on,
-- and move its birth back to the last moment anything could have taken from a refill bucket
-- (quotas/core/recovery.py). Only ever earlier: a decision on stale reads cannot lengthen it.
-- KEYS[1] epoch hash. ARGV[1] the epoch's born as decided on (another epoch: no change),
-- ARGV[2] the new until, ARGV[3] the new born.
-- Returns 1 if it moved anything, 0 if not (another epoch by now, or moved already).
local e = redis.call('HMGET', KEYS[1], 'born', 'until')
if not e[1] or tonumber(e[1]) ~= tonumber(ARGV[1]) then return 0 end
local until_ = math.min(tonumber(e[2]), tonumber(ARGV[2]))
local born = math.min(tonumber(e[1]), tonumber(ARGV[3]))
if until_ == tonumber(e[2]) and born == tonumber(e[1]) then return 0 end
redis.call('HSET', KEYS[1], 'born', string.format('%.17g', born),
  'until', string.format('%.17g', until_))
return 1
