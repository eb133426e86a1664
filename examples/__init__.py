"""Examples a team copies: each tested (tests/unit), none deployed by the app itself."""
