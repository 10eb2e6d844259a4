-- Claim up to ARGV[1] ledger records for one flush.
-- KEYS[1] the ledger queue (list), KEYS[2] this flush's claim list, KEYS[3] claims index (zset:
-- claim key -> claim time). ARGV[1] batch size (records), ARGV[2] now (epoch seconds).
-- Returns the claimed records. Moving them in one script means a crash between claim and store
-- leaves them in the claim list, from where a later flush returns them to the queue.
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items == 0 then
  return items
end
redis.call('LTRIM', KEYS[1], #items, -1)
redis.call('RPUSH', KEYS[2], unpack(items))
redis.call('ZADD', KEYS[3], ARGV[2], KEYS[2])
return items
