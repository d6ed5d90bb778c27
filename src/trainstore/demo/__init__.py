"""The end-to-end demo: ingest -> clean -> features -> train with checkpoints -> crash and
resume -> corruption and fallback -> lifecycle -> summary and HTML report.

``run_demo`` (``demo.pipeline``) runs it; ``trainstore demo`` and ``trainstore report`` are
the CLI. Each stage is its own module: ``synthetic`` (raw data), ``datastages``, ``train``
(the training worker), ``crash``, ``recovery``, ``lifecycle_stage``, ``inventory`` (storage by
tier, lineage), ``summary``, ``report`` (+ ``svg``).
"""
