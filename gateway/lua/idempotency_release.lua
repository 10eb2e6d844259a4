-- Give back an Idempotency-Key claim that delivered no answer, but only the caller's own.
-- KEYS[1] the key's record (hash, see idempotency_claim.lua); ARGV[1] that request's id.
-- Returns 1 when the claim was deleted, 0 when another request holds it, nobody does, or it
-- already holds a delivered answer (that is never given back).
local r = redis.call('HMGET', KEYS[1], 'owner', 'state')
if r[1] == ARGV[1] and r[2] == 'pending' then
  return redis.call('DEL', KEYS[1])
end
return 0
