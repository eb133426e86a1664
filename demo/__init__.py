"""The local demo (`make run`) and the local stack it runs on (also used by e2e, chaos, bench)."""
