"""What every part of the app stands on and reports through: logs, metrics, traces, request
counts, and the failpoints the crash tests use. It imports nothing of the app but ``core``."""
