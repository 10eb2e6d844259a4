-- reap: expire up to ARGV[3] abandoned leases whose expiry has passed (SPEC C9). Their
-- concurrency holds go back; other estimates stand (the request may have been dispatched).
-- KEYS[1] epoch hash, KEYS[2] lease index (zset: record key -> expiry).
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] max lease (s), ARGV[3] limit,
-- ARGV[4] retention (s). Record and bucket keys are read from the index and the records:
-- standalone Redis only (a Cluster port runs this per slot with a per-slot index).
-- Returns {now, k, (id, created, expires, n, (name, amount)*n)*k}.
local now = clock(ARGV[1])
epoch(KEYS[1], now, tonumber(ARGV[2]))
local retention = tonumber(ARGV[4])
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local out = {fmt(now), 0}
for _, rkey in ipairs(due) do
  redis.call('ZREM', KEYS[2], rkey)
  local rec = record_load(rkey, now, retention)
  if rec and rec[1] == 'a' then
    record_expire(rkey, rec, KEYS[2], now, retention)
    out[2] = out[2] + 1
    out[#out + 1] = rec[5]
    out[#out + 1] = fmt(rec[2])
    out[#out + 1] = fmt(rec[3])
    out[#out + 1] = rec[4]
    for i = 1, rec[4] do
      local at = rec_row(i)
      out[#out + 1] = rec[at + 5]
      out[#out + 1] = fmt(rec[at + 1])
    end
  end
end
return out
