"""The model checker of the order engine (contract 3.15): a Hypothesis state machine that
generates workflows and plays every remote, operator and timer, checking I1-I7 after every
transition. ``tests/model/test_engine_model.py`` runs it under pytest; ``python -m
tests.model --budget SECONDS`` searches longer (``make model-check``)."""
