"""The examples' handlers tested with the kit, without a broker: the team-style tests of
examples/testing_handlers.py (quoted by docs/testing.md) run here as they would in a team's
suite, with the plugin's fixtures."""

from examples.testing_handlers import (
    kit,
    test_a_failing_event_is_dead_lettered_and_the_rest_applied,
    test_a_failing_handler_fails_the_test,
    test_a_redelivered_order_is_charged_once,
    test_an_order_is_charged,
    test_events_of_one_order_apply_in_order,
    test_the_saga_step_emits_one_event_per_order,
)

__all__ = [
    "kit",
    "test_a_failing_event_is_dead_lettered_and_the_rest_applied",
    "test_a_failing_handler_fails_the_test",
    "test_a_redelivered_order_is_charged_once",
    "test_an_order_is_charged",
    "test_events_of_one_order_apply_in_order",
    "test_the_saga_step_emits_one_event_per_order",
]
