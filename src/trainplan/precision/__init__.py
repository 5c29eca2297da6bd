"""Per-op mixed precision and the seed-000 overflow loop (S1 detect, S2 root cause, S3 deny-list)."""
