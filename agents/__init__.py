"""Agents: one per remote service; each wraps its calls in deadlines, retries and a breaker."""
