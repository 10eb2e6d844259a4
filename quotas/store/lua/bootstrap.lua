-- bootstrap: declare a store known to be new (first deployment, tests): no learning period.
-- KEYS[1] epoch hash. No ARGV. Returns 1 if it created the epoch, 0 if one existed already.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'born', '0', 'until', '0')
return 1
