"""Passwords the test emulators accept (test-only values)."""

REDFISH_PASSWORD = "redfish-secret-4711"
IPMI_PASSWORD = "ipmi-secret-0815"
