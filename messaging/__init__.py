"""Message transports: Storage queues, and the agent request/reply transports."""
