"""Benchmarks: they print JSON numbers; nothing here asserts a speed."""
