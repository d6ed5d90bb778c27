"""Test helpers shipped with the package for users' own tests: the store conformance suite
(``store_suite``) and a real S3-protocol server on loopback (``s3server``). trainstore's own
harness (ranks, fault proxy, crash children) lives in the repository's ``tests/harness``."""
