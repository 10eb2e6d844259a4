-- queue_pump: hand out what fits to a pool's waiters in start-tag order (SPEC D2); run when a
-- waiter's process wakes at the pool's next fit time (refill, lease expiry, pause end).
-- KEYS[1] epoch hash, KEYS[2] lease index, KEYS[3..6] the pool's qp:s, qp:h, qp:l, qp:d.
-- ARGV[1] now (epoch s; '' = Redis TIME), ARGV[2] qp, ARGV[3] retention (s),
-- ARGV[4] max lease (s), ARGV[5] expiry limit.
-- Returns {now, next_fit, depth, granted, refused} (next_fit: 'inf' = only a release helps).
local now = clock(ARGV[1])
local born, learning_until = epoch(KEYS[1], now, tonumber(ARGV[4]))
local Q = q_load(ARGV[2])
if redis.call('ZCARD', Q.d) == 0 then return q_pumped(now, INF, 0, 0, 0) end
local ctx = {now = now, born = born, learning_until = learning_until,
             limit = tonumber(ARGV[5]), retention = tonumber(ARGV[3]), index = KEYS[2]}
local next_fit, granted, refused, _, depth = q_pump(Q, ctx, nil)
return q_pumped(now, next_fit, granted, refused, depth)
