-- Store the answer a request delivered under its Idempotency-Key, for replay.
-- KEYS[1] the key's record (hash, see idempotency_claim.lua). ARGV[1] the request's id,
-- ARGV[2] state (answered, streamed or large), ARGV[3] HTTP status, ARGV[4] headers (JSON),
-- ARGV[5] body (bytes; empty unless answered), ARGV[6] TTL (seconds).
-- Returns 1 when stored, 0 when the key is not this request's (its claim expired, another holds it).
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'status', ARGV[3], 'headers', ARGV[4],
  'content', ARGV[5])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
return 1
