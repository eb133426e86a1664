"""The product's tests (docs/local-development.md, "Tests", says what each layer covers)."""

#: The declarations every test runs on: the suite's own (tests/conftest.py says why).
SUITE_DECLARATIONS = "tests.fixtures.shop"
