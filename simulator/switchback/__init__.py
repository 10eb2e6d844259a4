"""The switchback experiment (SPEC G16) on a simulated provider market.

A discrete-event simulation drives the real cores on a simulated clock: the routing core
(``routing.core.Router``; ``price_only`` is the old router), the broker's reservation book,
fair queue and bucket arithmetic (``quotas.store.memory``, ``quotas.core.queuebook`` over
``quotas.core``), the provider behaviour model (``simulator.model``), and the retry policy
(``quotas.core.retry``). Nothing of them is
re-implemented here; what is here is the glue a gateway process would be.

Modules, in the order a request meets them:

- ``traffic``  — arrivals from the market file's ``traffic`` section (diurnal rate,
  conversations, tools, whales); ``SimRequest``.
- ``gateway``  — the request path: plan, admit, dispatch, reconcile, retry within one budget,
  observe.
- ``admission`` — the broker as the gateway drives it: a fast try per candidate, then the
  fair queue (``quotas.core.queuebook``) until the deadline; pauses after 429s; C12 headers.
- ``market``   — providers, buckets (``quotas.core.specs``), endpoints and prices from the two
  files, scaled by ``--scale``.
- ``loop``     — the event heap; ``design`` — blocks, pairs, order, segments;
  ``runner`` — one segment in one process; ``metrics`` — what is measured, and how.
- ``analysis`` — changes new/old − 1 with bootstrap CIs over pairs; ``report`` — markdown, plots.
- ``experiment`` — ``experiment_run(Options(...)) -> Run``: everything, segments in parallel.

``python manage.py switchback --config FILE --market FILE [--days N] [--scale X] [--json OUT]
[--plots DIR] [--report FILE] [--arms new,old] [--segments N] [--workers N] [--seed N]``.
"""
