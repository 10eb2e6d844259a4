-- queue_settle: settle.lua (reconcile or release) and then the pool's pump, in one call, so
-- capacity given back goes to the next waiter at once (SPEC C6, D2). settle.lua is the body of
-- settle_main(KEYS, ARGV) in the function library (quotas/store/library.py).
-- KEYS: settle.lua's 3 (the pool's keys are made from qp, as queue_admit's are).
-- ARGV: settle.lua's 10 (the pool's qp and the store's settings come from the spec set).
-- Returns {settle.lua's reply, {now, next_fit, depth, granted, refused}}, or {'S'} when the
-- spec key is unknown (nothing done). An empty queue costs one ZCARD after the settle.
local settled, specs = settle_main(KEYS, ARGV)
if settled[1] == 'S' then return settled end
local now = tonumber(settled[2])
local Q = q_keys(specs[4])
if redis.call('ZCARD', Q.d) == 0 then return {settled, q_pumped(now, INF, 0, 0, 0)} end
Q = q_load(specs[4])
local born, learning_until = epoch(KEYS[1], now, specs[6])
local ctx = {now = now, born = born, learning_until = learning_until,
             limit = specs[7], retention = specs[5], index = KEYS[2]}
local next_fit, granted, refused, _, depth = q_pump(Q, ctx, nil)
return {settled, q_pumped(now, next_fit, granted, refused, depth)}
