"""The contracts between the parts: what the harness and every backend agree on, importing neither.

    cells.py     the cell (one measurement) and its specs, the SLA, and a cell run's result
    records.py   the raw records a backend reports: per request, per engine step, the window, server counters
    metric.py    a derived value (value, unit, n) and the long-form set the store keeps
    backend.py   the backend protocol, its errors and the lazy registry of backends by name
    names.py     the names a suite may use (methods, heads, policies, dtypes), once
    redaction.py the secrets rule: what no row, log or export may hold

Layering (tests/test_import_graph.py checks it): harness → backends → inputs → contracts; dspark_core and
contracts are leaves. A backend fills these records; `harness.metrics` derives every number from them.
"""
