"""Pure quota arithmetic (SPEC B–C): no Django, no Redis, no clock — ``now`` is a parameter."""
