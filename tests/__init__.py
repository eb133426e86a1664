"""The product's tests (the README's "Tests" section says what each layer covers)."""

#: The declarations every test runs on: the suite's own (tests/conftest.py says why).
SUITE_DECLARATIONS = "tests.fixtures.shop"
