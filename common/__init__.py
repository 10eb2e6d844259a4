"""What every app needs and no app owns: the Redis connection and key names (``redis``), the
configuration file's value readers and duration syntax (``reader``, ``durations``), the model
mixin that checks fields with those readers (``rules``), the fault log (``faultlog``),
database work off the event loop that survives a database restart (``db``), the error
envelope's base (``errors``) and the admin base that reloads the gateways on a change (``admin``).

The bottom of the house: it imports no package of the project, only the standard library,
Django and Redis.
"""
