-- Claim an Idempotency-Key for one request, or return what the key already holds. One script,
-- so of two concurrent first requests exactly one claims.
-- KEYS[1] the key's record (hash: owner, digest, state, status, headers, content).
-- ARGV[1] the request's id, ARGV[2] its body digest (sha256 hex), ARGV[3] TTL (seconds).
-- Returns {1} when this request claimed the key, else {0, owner, digest, state, status,
-- headers, content} (nil for a field not stored); state is pending, answered, streamed or large.
if redis.call('HSETNX', KEYS[1], 'owner', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'digest', ARGV[2], 'state', 'pending')
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
  return {1}
end
local r = redis.call('HMGET', KEYS[1], 'owner', 'digest', 'state', 'status', 'headers', 'content')
return {0, r[1], r[2], r[3], r[4], r[5], r[6]}
