-- Give back an Idempotency-Key claim, but only the caller's own.
-- KEYS[1] the claim (string: the id of the request that holds it); ARGV[1] that request's id.
-- Returns 1 when the claim was deleted, 0 when another request holds it (or nobody does).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
