"""The scheduler: submit orders, claim and dispatch steps, apply agent replies, run workflows."""
