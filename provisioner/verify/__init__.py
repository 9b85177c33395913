"""`provision verify`: check the running cluster against the manifest (docs/verify.md)."""
