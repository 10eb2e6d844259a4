"""The reservation store: one interface (``base.ReservationStore``), two implementations —
Redis + Lua (``redis.RedisReservationStore``) and the in-memory twin over the pure core
(``memory.MemoryReservationStore``), checked by one contract suite."""
